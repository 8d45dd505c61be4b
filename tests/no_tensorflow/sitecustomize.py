"""Put this folder first on ``PYTHONPATH`` and a Python process starts as
on a machine without TensorFlow: every finder answers "not found" for
these packages (``import tensorflow`` raises ModuleNotFoundError,
``importlib.util.find_spec`` gives None), in that process and in the
processes it starts."""

import sys

BLOCKED = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "tf_keras")


class _Hidden:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            return None
        find = getattr(self.finder, "find_spec", None)
        return None if find is None else find(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


sys.meta_path[:] = [_Hidden(f) for f in sys.meta_path]
