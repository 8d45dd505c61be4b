"""keras_trm: the original Transformer family for Keras 3.

The core (layers, models, training, the searches, ``Translator.translate_texts``,
``GreedyBleu``, SentencePiece) runs on the backend Keras 3 selects:
TensorFlow, JAX or PyTorch, the last two without TensorFlow installed. The
data pipeline, the in-graph tokenizers, ``Translator.translate``, the
exports and the server are TensorFlow by design and import it when used
(docs/getting-started.md). Importing the package changes no environment
variable.
"""

import importlib

from keras_trm._runtime import is_command_process

__version__ = "0.1.0"

_SUBMODULES = ("layers", "models", "training")

if not is_command_process():  # training registers its schedule and loss
    for _name in _SUBMODULES:
        importlib.import_module(f"{__name__}.{_name}")


def __getattr__(name):
    # The ``keras-trm`` command imports them when a command uses them (its
    # --help starts no TensorFlow; keras_trm._runtime.is_command_process).
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
