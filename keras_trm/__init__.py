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

import importlib

from keras_trm._runtime import is_command_process

__version__ = "0.1.0"

_SUBMODULES = ("layers", "models", "training")

if not is_command_process():
    from keras_trm import layers  # noqa: F401
    from keras_trm import models  # noqa: F401
    from keras_trm import training  # noqa: F401  (registers schedule, loss)


def __getattr__(name):
    # The ``keras-trm`` command imports them when a command uses them (its
    # --help starts no TensorFlow; keras_trm._runtime.is_command_process).
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
