"""keras_trm: the original Transformer family for Keras 3.

The core (``keras_trm.layers``, ``keras_trm.models``, ``keras_trm.training``,
``keras_trm.decoding``'s searches, ``Translator.translate_texts`` and
``GreedyBleu``, and SentencePiece in ``keras_trm.text``) runs on the
backend Keras 3 selects (``KERAS_BACKEND``, ``~/.keras/keras.json``):
TensorFlow, JAX or PyTorch, the last two without TensorFlow installed. The
data pipeline, the in-graph tokenizers, ``Translator.translate``, the
exports and the server are TensorFlow by design and import it when used (docs/getting-started.md,
"JAX or PyTorch, without TensorFlow"). Importing the package changes no
environment variable.
"""

from keras_trm import layers  # noqa: F401
from keras_trm import models  # noqa: E402,F401
from keras_trm import training  # noqa: E402,F401  (registers schedule, loss)

__version__ = "0.1.0"
