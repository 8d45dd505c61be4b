"""End-to-end jobs behind the recipes and the CLI.

The translation job (``translation``), the language-model job
(``language_model``) and the pure-Python ``stages`` they are built on run
on TensorFlow, JAX and PyTorch, also where TensorFlow is not installed
(the usual GPU machine; only their SavedModel exports need TensorFlow).
Without TensorFlow the other jobs (IMDB and MNIST through tfds) raise ``require_tensorflow``'s ``ImportError`` (what to
install) when they are imported.
"""

import importlib.util
import sys

from keras_trm._optional import require_tensorflow

# The jobs that need TensorFlow (module names in this package); the others
# (the translation and LM jobs, their configs, the stages) run without it.
TENSORFLOW_JOBS = frozenset({"imdb", "mnist"})


class _TensorFlowJobs:
    """``sys.meta_path`` finder, installed only where TensorFlow is missing:
    importing one of ``TENSORFLOW_JOBS`` raises
    ``require_tensorflow``'s error instead of a bare ``No module named
    'tensorflow'`` from deep inside it."""

    def find_spec(self, name, path=None, target=None):
        head, dot, rest = name.partition(__name__ + ".")
        if not head and dot and rest.split(".")[0] in TENSORFLOW_JOBS:
            require_tensorflow(name)  # raises ImportError
        return None


def tensorflow_installed():
    """Whether ``import tensorflow`` can find it (without importing it: a
    JAX process on a machine that has TensorFlow does not pay for it)."""
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        return False


if not tensorflow_installed():
    sys.meta_path.insert(0, _TensorFlowJobs())
