"""Optional dependencies: TensorFlow above the backend line, the extras.

The TensorFlow-only modules (tf.data, tf-text, exports, the server) are
imported on first use (``lazy_module_attributes``); without TensorFlow
that use raises an ``ImportError`` naming what to install.
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
    installs it: the server (``serve``), LiteRT (``litert``) and plots
    (``plots``) are not in the core install.

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
    load only when used; without TensorFlow, ``require_tensorflow``'s
    ``ImportError``.

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
            if (err.name or "").split(".")[0] in ("tensorflow", "tensorflow_text"):
                require_tensorflow(f"{package}.{name}")
            raise
        return getattr(loaded, name)

    return __getattr__
