"""keras_trm: the original Transformer family for Keras 3.

The package runs on Keras 3 with the TensorFlow backend (tf.data, tf.distribute,
SavedModel and tensorflow-text are part of the design), Keras 3's default:
importing it changes no environment variable, and raises ``ImportError``
when another backend is selected (``KERAS_BACKEND``, ``~/.keras/keras.json``).
"""

from keras_trm import layers  # noqa: F401
from keras_trm import models  # noqa: E402,F401
from keras_trm import training  # noqa: E402,F401  (registers schedule, loss)

__version__ = "0.1.0"
