"""SavedModel export in TF Serving's ``<export_dir>/<model_name>/<version>/``
layout, written atomically."""

import os
import pathlib

import tensorflow as tf

from keras_trm.export.warmup import warmup_path, write_warmup_requests
from keras_trm.utils.files import atomic_directory, tree_bytes


def next_version(model_dir):
    """1 + the largest integer-named version folder under ``model_dir``.

    Example:

    >>> import pathlib
    >>> import tempfile
    >>> model_dir = pathlib.Path(tempfile.mkdtemp())
    >>> next_version(model_dir)
    1
    >>> for name in ("1", "7", "notes"):
    ...     (model_dir / name).mkdir()
    >>> next_version(model_dir)
    8
    """
    model_dir = pathlib.Path(model_dir)
    versions = [int(p.name) for p in model_dir.glob("*") if p.name.isdigit()]
    return max(versions, default=0) + 1


def export_module(module, export_dir, model_name, signatures, version=None,
                  assets=None, warmup_requests=None):
    """Saves ``module`` as ``<export_dir>/<model_name>/<version>``.

    The SavedModel is written to a temporary folder beside the target and
    renamed into place only once complete: a failed export leaves nothing
    half-written, and TF Serving never sees a partial version.

    Args:
        module: a ``tf.Module`` holding the variables.
        export_dir: root folder (the repo's ``export/``).
        model_name: str, e.g. ``"transformer_multi30k_en_de"``.
        signatures: dict name -> concrete/``tf.function`` with a signature.
        version: int or None (next free version).
        assets: optional dict filename -> text, written to ``assets.extra/``.
        warmup_requests: optional list of ``(signature_name, inputs)``,
            written as TF Serving's warm-up file
            (``assets.extra/tf_serving_warmup_requests``, see
            ``keras_trm.export.warmup``), replayed by the server at load.

    Returns:
        ``pathlib.Path`` of the version folder.

    Raises:
        FileExistsError: the version folder already exists.
        OSError: ``errno.ENOSPC`` when ``export_dir``'s file system is
            full, naming the version folder and the space needed (the size
            of the newest existing version, when there is one) and free,
            e.g. ``no space left on device writing export/m/2: needed
            ~4.2 MB, 1.0 MB free``; nothing of the new version remains.
        ValueError: ``model_name`` empty or containing a path separator;
            bad ``warmup_requests`` (before anything is written).

    Example:

    >>> import shutil
    >>> import tempfile
    >>> import tensorflow as tf
    >>> class Double(tf.Module):
    ...     @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    ...     def serve(self, x):
    ...         return {"y": 2.0 * x}
    >>> module, root = Double(), tempfile.mkdtemp()
    >>> path = export_module(module, root, "double",
    ...                      signatures={"serving_default": module.serve})
    >>> path.parent.name, path.name   # <export_dir>/<model_name>/<version>
    ('double', '1')
    >>> serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    >>> serve(tf.constant([1.0, 2.5]))["y"].numpy().tolist()
    [2.0, 5.0]
    >>> shutil.rmtree(root)
    """
    if not model_name or os.sep in model_name or model_name.startswith("."):
        raise ValueError(f"`model_name` must be a plain folder name, got {model_name!r}")
    model_dir = pathlib.Path(export_dir) / model_name
    model_dir.mkdir(parents=True, exist_ok=True)
    version = next_version(model_dir) if version is None else int(version)
    target = model_dir / str(version)
    if target.exists():
        raise FileExistsError(f"export version {str(target)!r} already exists")
    if warmup_requests is not None:
        _check_warmup_requests(warmup_requests, signatures)
    versions = [p for p in model_dir.glob("*") if p.name.isdigit() and p.is_dir()]
    previous = max(versions, key=lambda p: int(p.name), default=None)
    with atomic_directory(target, expected_size=previous and tree_bytes(previous)) as tmp:
        tf.saved_model.save(module, str(tmp), signatures=signatures)
        if assets or warmup_requests:
            extra = tmp / "assets.extra"
            extra.mkdir(exist_ok=True)
            for name, text in (assets or {}).items():
                (extra / name).write_text(text, encoding="utf-8")
            if warmup_requests:
                write_warmup_requests(warmup_path(tmp), warmup_requests)
    return target


def _check_warmup_requests(requests, signatures):
    for i, request in enumerate(requests):
        name = request[0] if isinstance(request, (tuple, list)) and request else None
        if name not in signatures:
            raise ValueError(
                f"`warmup_requests[{i}]` must name one of the signatures "
                f"{sorted(signatures)}, got {name!r}")
