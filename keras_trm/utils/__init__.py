"""Small helpers shared by the library: atomic file and folder writes."""

from keras_trm.utils.files import atomic_directory, atomic_write, write_json

__all__ = ["atomic_directory", "atomic_write", "write_json"]
