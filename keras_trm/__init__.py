"""keras_trm: the original Transformer family for Keras 3.

The package runs on Keras 3 with the TensorFlow backend (tf.data, tf.distribute,
SavedModel and tensorflow-text are part of the design). Importing it selects
that backend unless ``KERAS_BACKEND`` is already set.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

if keras.backend.backend() != "tensorflow":
    raise ImportError(
        "keras_trm needs the TensorFlow backend of Keras 3, got "
        f"KERAS_BACKEND={keras.backend.backend()!r}. Unset KERAS_BACKEND or "
        "set it to 'tensorflow'."
    )

from keras_trm import layers  # noqa: E402,F401
from keras_trm import models  # noqa: E402,F401
from keras_trm import training  # noqa: E402,F401  (registers schedule, loss)

__version__ = "0.1.0"
