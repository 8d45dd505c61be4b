"""End-to-end jobs behind the recipes and the CLI.

The translation and language-model jobs run on TensorFlow, JAX and
PyTorch, also where TensorFlow is not installed (only their SavedModel
exports need it). There, importing the others (IMDB and MNIST, through
tfds) raises ``require_tensorflow``'s ``ImportError`` (what to install).
"""

import importlib.util
import sys

from keras_trm._optional import require_tensorflow

TENSORFLOW_JOBS = frozenset({"imdb", "mnist"})  # the modules that need TensorFlow


class _TensorFlowJobs:
    """``sys.meta_path`` finder, installed where TensorFlow is missing:
    importing one of ``TENSORFLOW_JOBS`` raises ``require_tensorflow``'s
    error, not a bare ``No module named 'tensorflow'``."""

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


def export_elsewhere(command):
    """``(path, None)``: the SavedModel export ``command`` of a JAX or
    PyTorch run, done in a TensorFlow child process; ``(None, command)``
    where TensorFlow is not installed (the command is printed)."""
    if tensorflow_installed():
        from keras_trm.jobs._setup import export_in_tensorflow

        return export_in_tensorflow(command), None
    print("no TensorFlow here, so no SavedModel: on a machine with "
          f"TensorFlow and this workdir, run\n  {command}", flush=True)
    return None, command


if not tensorflow_installed():
    sys.meta_path.insert(0, _TensorFlowJobs())
