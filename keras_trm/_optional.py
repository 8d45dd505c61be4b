"""Optional dependencies: TensorFlow above the backend line, the extras.

The layers, models, training pieces and searches run on any Keras 3
backend (``keras.ops`` only). The tf.data pipeline, the tf-text tokenizers,
the SavedModel / LiteRT export and the server are TensorFlow by design:
their modules are imported on first use (``lazy_module_attributes``), and
without TensorFlow that use raises an ``ImportError`` naming what to
install.
"""

import importlib

TENSORFLOW_INSTALL = 'pip install "tensorflow>=2.21,<2.22" "tensorflow-text>=2.21,<2.22"'


def require_tensorflow(feature):
    """Imports and returns ``tensorflow``; without it, raises
    ``ImportError`` naming ``feature`` and the install command.

    Example:

    >>> require_tensorflow("keras_trm.data").__name__   # where it is installed
    'tensorflow'
    """
    try:
        import tensorflow
    except ImportError as err:
        raise ImportError(
            f"{feature} needs TensorFlow (tf.data, tensorflow-text, "
            f"SavedModels), which is not installed: {TENSORFLOW_INSTALL}. "
            "The layers, models, training pieces and searches run without it "
            "on JAX or PyTorch (KERAS_BACKEND=jax or torch).") from err
    return tensorflow


def require_extra(extra, modules, feature):
    """Imports ``modules`` (names); the first that is missing raises
    ``ImportError`` naming ``feature``, the module and the extra that
    installs it (``pip install "keras_trm[serve]"``).

    The core install (``pip install keras_trm``) holds what the layers,
    models, training, data, text and decoding need; the server
    (``serve``: flask, waitress, grpcio, tensorflow-serving-api,
    prometheus-client), LiteRT (``litert``) and plots (``plots``:
    matplotlib) are extras.

    Raises:
        ImportError: a module of ``modules`` is not installed.

    Example:

    >>> require_extra("plots", ["math"], "report plots")
    >>> require_extra("serve", ["no_such_module_x"], "keras_trm.serving")
    Traceback (most recent call last):
    ...
    ImportError: keras_trm.serving needs 'no_such_module_x', which is not installed: pip install "keras_trm[serve]"
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ImportError(
                f"{feature} needs {module!r}, which is not installed: "
                f'pip install "keras_trm[{extra}]"') from err


def lazy_module_attributes(package, attributes):
    """A module ``__getattr__`` that imports ``attributes[name]`` (a module
    path) when ``package.name`` is first read, so that TensorFlow-only parts
    of a package load only when used. A failing import of such a module
    raises the ``ImportError`` of ``require_tensorflow``.

    Example:

    >>> get = lazy_module_attributes("keras_trm.utils", {"atomic_write": "keras_trm.utils.files"})
    >>> get("atomic_write").__name__
    'atomic_write'
    """

    def __getattr__(name):
        if name not in attributes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = attributes[name]
        try:
            loaded = importlib.import_module(module)
        except ImportError as err:
            if getattr(err, "name", None) and err.name.split(".")[0] in (
                    "tensorflow", "tensorflow_text"):
                require_tensorflow(f"{package}.{name}")
            raise
        return getattr(loaded, name)

    return __getattr__
