"""SavedModel export in TF Serving's ``<export_dir>/<model_name>/<version>/``
layout, written atomically."""

import os
import pathlib

import tensorflow as tf

from keras_trm.utils import checks as v
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
        signatures: non-empty dict name -> concrete/``tf.function`` with a
            signature.
        version: int >= 0, or None (the next free version, from 1). TF
            Serving serves any folder whose name is an int64 >= 0, 0
            included, and by default the largest; a float, bool or
            negative number is refused rather than rounded or written as a
            folder TF Serving would not serve.
        assets: optional dict filename -> text (str), written to
            ``assets.extra/``; a filename is relative and stays inside
            that folder (``sub/a.txt`` makes ``sub/``).
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
        TypeError: ``model_name`` not a str; ``version`` not an int (2.5,
            True); ``signatures`` not a dict; an asset's name or text not a
            str.
        ValueError: ``model_name`` empty, starting with "." or containing a
            path separator; ``version`` negative; ``signatures`` None or
            empty; an asset's name absolute, empty or leaving
            ``assets.extra/`` (``../x``); bad ``warmup_requests``. All of
            these before anything is written.

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
    # Every argument is checked before anything is created.
    if not isinstance(model_name, str):
        raise TypeError(f"`model_name` must be a str (a folder name), got "
                        f"model_name={model_name!r}")
    if (not model_name or os.sep in model_name or (os.altsep and os.altsep in model_name)
            or model_name.startswith(".")):
        raise ValueError(f"`model_name` must be a plain folder name, got {model_name!r}")
    if version is not None:
        version = v.non_negative_int("version", version)
    if not isinstance(signatures, dict) or not signatures:
        raise (ValueError if isinstance(signatures, dict) or signatures is None
               else TypeError)(
            "`signatures` must be a non-empty dict of name -> function (without "
            "one the SavedModel has nothing to serve), got "
            f"signatures={signatures!r}")
    assets = _checked_assets(assets)
    if warmup_requests is not None:
        _check_warmup_requests(warmup_requests, signatures)
    model_dir = pathlib.Path(export_dir) / model_name
    model_dir.mkdir(parents=True, exist_ok=True)
    version = next_version(model_dir) if version is None else version
    target = model_dir / str(version)
    if target.exists():
        raise FileExistsError(f"export version {str(target)!r} already exists")
    versions = [p for p in model_dir.glob("*") if p.name.isdigit() and p.is_dir()]
    previous = max(versions, key=lambda p: int(p.name), default=None)
    with atomic_directory(target, expected_size=previous and tree_bytes(previous)) as tmp:
        tf.saved_model.save(module, str(tmp), signatures=signatures)
        if assets or warmup_requests:
            extra = tmp / "assets.extra"
            extra.mkdir(exist_ok=True)
            for name, text in assets.items():
                (extra / name).parent.mkdir(parents=True, exist_ok=True)
                (extra / name).write_text(text, encoding="utf-8")
            if warmup_requests:
                write_warmup_requests(warmup_path(tmp), warmup_requests)
    return target


def _checked_assets(assets):
    """``assets`` as a dict (empty for None), each name a relative path
    that stays inside ``assets.extra/`` (a name such as ``../../x`` wrote
    outside the export's temporary folder, where a failed export left it)
    and each text a str."""
    if assets is None:
        return {}
    if not isinstance(assets, dict):
        raise TypeError(f"`assets` must be a dict filename -> text, got assets={assets!r}")
    for name, text in assets.items():
        if not isinstance(name, str):
            raise TypeError(f"`assets` names must be str, got {name!r}")
        parts = pathlib.PurePath(name).parts
        if (not name or pathlib.PurePath(name).is_absolute() or os.path.isabs(name)
                or ".." in parts or not parts or name.endswith(("/", os.sep))):
            raise ValueError(
                "`assets` names must be relative file names inside "
                f"assets.extra/, got {name!r}")
        if not isinstance(text, str):
            raise TypeError(f"`assets[{name!r}]` must be a str, got "
                            f"{type(text).__name__}")
    return assets


def _check_warmup_requests(requests, signatures):
    for i, request in enumerate(requests):
        name = request[0] if isinstance(request, (tuple, list)) and request else None
        if name not in signatures:
            raise ValueError(
                f"`warmup_requests[{i}]` must name one of the signatures "
                f"{sorted(signatures)}, got {name!r}")
