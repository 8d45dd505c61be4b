"""Atomic writes: a file or a folder appears complete or not at all.

Every writer of the package (result JSON, reports, vocabularies, weight
checkpoints, SavedModel exports, LiteRT files) goes through these two
helpers: the content is written under a temporary name in the target's own
folder (same file system) and renamed into place with ``os.replace`` /
``os.rename``, which POSIX makes atomic. A crash or an exception leaves the
old target (or none) and no half-written file; the temporary is removed.
"""

import contextlib
import json
import os
import pathlib
import shutil
import tempfile


def _temp_name(path, suffix=""):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                               suffix=".tmp" + suffix)
    os.close(fd)
    return pathlib.Path(tmp)


@contextlib.contextmanager
def atomic_file(path, suffix=""):
    """Context manager yielding a temporary path beside ``path``; on a clean
    exit the temporary replaces ``path`` (``os.replace``), on an exception
    it is removed and ``path`` is untouched.

    For writers that want a file name rather than data (e.g.
    ``model.save_weights``, whose format follows ``suffix`` such as
    ``".weights.h5"``). The temporary exists (empty) when the block starts.

    Example:

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_file(folder / "a.txt") as tmp:
    ...     _ = tmp.write_text("done")
    >>> (folder / "a.txt").read_text()
    'done'
    """
    path = pathlib.Path(path)
    tmp = _temp_name(path, suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write(path, data, encoding="utf-8"):
    """Writes ``data`` (``str`` as ``encoding``, or ``bytes``) to ``path``
    atomically; creates the parent folders. Returns ``path`` as a
    ``pathlib.Path``.

    Raises:
        TypeError: ``data`` is neither ``str`` nor ``bytes`` (nothing is
            written).

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "out" / "hello.txt"
    >>> atomic_write(path, "hi\\n").read_text()
    'hi\\n'
    """
    if isinstance(data, str):
        data = data.encode(encoding)
    elif not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"`data` must be str or bytes, got {type(data).__name__}")
    path = pathlib.Path(path)
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return path


def write_json(path, data, indent=1):
    """``data`` as indented JSON (UTF-8, trailing newline), written with
    ``atomic_write``. Returns the path.

    Example:

    >>> import json, pathlib, tempfile
    >>> path = write_json(pathlib.Path(tempfile.mkdtemp()) / "r.json", {"a": 1})
    >>> json.loads(path.read_text())
    {'a': 1}
    """
    return atomic_write(path, json.dumps(data, indent=indent,
                                         ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_directory(path, exist_ok=False):
    """Context manager yielding an empty temporary folder beside ``path``;
    on a clean exit it is renamed to ``path``, on an exception it is
    deleted (``path`` untouched).

    Args:
        path: the folder to create, e.g. ``export/<name>/<version>``.
        exist_ok: if True an existing ``path`` is replaced (removed just
            before the rename); if False it is an error.

    Raises:
        FileExistsError: ``path`` exists and ``exist_ok`` is False (checked
            before and after the block).

    Example:

    >>> import pathlib, tempfile
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "model" / "1"
    >>> with atomic_directory(target) as tmp:
    ...     _ = (tmp / "weights.bin").write_bytes(b"\\0")
    >>> sorted(p.name for p in target.iterdir())
    ['weights.bin']
    """
    path = pathlib.Path(path)
    if path.exists() and not exist_ok:
        raise FileExistsError(f"`path` {str(path)!r} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=path.parent,
                                        prefix=f".tmp-{path.name}-"))
    try:
        yield tmp
        if path.exists():
            if not exist_ok:
                raise FileExistsError(f"`path` {str(path)!r} already exists")
            shutil.rmtree(path)
        os.rename(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
