"""Atomic writes: a file or a folder appears complete or not at all.

Every writer of the package (result JSON, reports, vocabularies, weight
checkpoints, SavedModel exports, LiteRT files) goes through these two
helpers: the content is written under a temporary name in the target's own
folder (same file system) and renamed into place with ``os.replace`` /
``os.rename``, which POSIX makes atomic. A crash or an exception leaves the
old target (or none) and no half-written file; the temporary is removed.

A full file system (``ENOSPC``, or a quota's ``EDQUOT``; also TensorFlow's
``ResourceExhaustedError`` "No space left on device" from its file writers)
is reported as one ``OSError`` with ``errno.ENOSPC`` that names the target
and the space needed and free (``no_space_error``), raised once the
temporary is removed, so the free space it reports is what a retry has.
"""

import contextlib
import errno
import json
import os
import pathlib
import shutil
import tempfile

_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXTS = ("no space left on device", "disk quota exceeded")


def format_bytes(n):
    """``n`` bytes as a short decimal size (1 kB = 1000 bytes).

    Example:

    >>> format_bytes(512), format_bytes(2_500), format_bytes(3_100_000)
    ('512 B', '2.5 kB', '3.1 MB')
    >>> format_bytes(7_340_000_000)
    '7.3 GB'
    """
    n = int(n)
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def is_no_space_error(error):
    """True if ``error`` (an exception) means the file system is full: an
    ``OSError`` with ``errno`` ``ENOSPC`` or ``EDQUOT``, or any error whose
    message says "No space left on device" / "Disk quota exceeded" (how
    TensorFlow's ``ResourceExhaustedError`` and HDF5 report it).

    Example:

    >>> import errno
    >>> is_no_space_error(OSError(errno.ENOSPC, "No space left on device"))
    True
    >>> is_no_space_error(PermissionError(errno.EACCES, "Permission denied"))
    False
    """
    if isinstance(error, OSError) and error.errno in _NO_SPACE_ERRNOS:
        return True
    text = str(error).lower()
    return any(t in text for t in _NO_SPACE_TEXTS)


def free_bytes(path):
    """Bytes free for an unprivileged user (``shutil.disk_usage(...).free``)
    on the file system of ``path``, or of its nearest existing parent
    folder when ``path`` does not exist yet.

    Example:

    >>> import tempfile
    >>> free_bytes(tempfile.gettempdir() + "/not/made/yet") > 0
    True
    """
    path = pathlib.Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def tree_bytes(path):
    """Size in bytes of the file ``path``, or of all files under the folder
    ``path``; 0 if it does not exist (links are not followed).

    Example:

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a").write_bytes(b"123")
    >>> tree_bytes(folder), tree_bytes(folder / "a"), tree_bytes(folder / "b")
    (3, 3, 0)
    """
    path = pathlib.Path(path)
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return 0
    return sum(p.lstat().st_size for p in path.rglob("*")
               if p.is_file() and not p.is_symlink())


def no_space_error(path, needed=None, written=None):
    """The ``OSError`` (``errno.ENOSPC``) this package raises when ``path``
    cannot be written because its file system is full, with the free space
    measured now (``free_bytes``).

    Args:
        path: the file or folder that was being written.
        needed: expected size in bytes (e.g. the previous file of the same
            kind), or None if unknown.
        written: bytes written before the failure (used when ``needed`` is
            unknown: the write needed more than that), or None.

    Example:

    >>> import tempfile
    >>> error = no_space_error(tempfile.gettempdir() + "/x.h5", needed=3_100_000)
    >>> error.errno == errno.ENOSPC
    True
    >>> str(error).split(": needed")[0].endswith("x.h5")
    True
    >>> "needed ~3.1 MB, " in str(error) and str(error).endswith(" free")
    True
    """
    free = format_bytes(free_bytes(path))
    if needed:
        size = f"needed ~{format_bytes(needed)}, {free} free"
    elif written:
        size = f"needed more than {format_bytes(written)}, {free} free"
    else:
        size = f"{free} free"
    return OSError(errno.ENOSPC,
                   f"no space left on device writing {path}: {size}")


def check_free_space(path, needed):
    """Raises ``no_space_error(path, needed)`` unless at least ``needed``
    bytes are free on the file system of ``path``. Returns ``path``.

    Raises:
        OSError: ``errno.ENOSPC``, naming ``path``, the bytes needed and
            free.

    Example:

    >>> import tempfile
    >>> check_free_space(tempfile.gettempdir(), 1) == tempfile.gettempdir()
    True
    >>> try:
    ...     check_free_space(tempfile.gettempdir(), 10**18)   # 1 EB
    ... except OSError as error:
    ...     print(error.errno == errno.ENOSPC, "needed ~1000000000.0 GB" in str(error))
    True True
    """
    if free_bytes(path) < int(needed):
        raise no_space_error(path, needed)
    return path


def process_umask():
    """The process's umask, read without changing it where Linux tells it
    (``/proc/self/status``), else by setting it and putting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def usual_permissions(path):
    """Gives ``path`` the permissions ``open`` / ``mkdir`` would have: 0666
    (a file) or 0777 (a folder) less the umask. ``tempfile.mkstemp`` and
    ``mkdtemp`` make them 0600 / 0700, so a file or a SavedModel written
    through a temporary could not be read by another user (a server
    running as its own user, say).

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkstemp()[1])
    >>> usual_permissions(path)
    >>> oct(path.stat().st_mode & 0o777) == oct(0o666 & ~process_umask())
    True
    """
    path = pathlib.Path(path)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~process_umask())


def _temp_name(path, suffix=""):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                               suffix=".tmp" + suffix)
    os.close(fd)
    usual_permissions(tmp)
    return pathlib.Path(tmp)


@contextlib.contextmanager
def atomic_file(path, suffix="", expected_size=None):
    """Context manager yielding a temporary path beside ``path``; on a clean
    exit the temporary replaces ``path`` (``os.replace``), on an exception
    (any, ``KeyboardInterrupt`` included) it is removed and ``path`` is
    untouched.

    For writers that want a file name rather than data (e.g.
    ``model.save``, whose format follows ``suffix`` such as ``".keras"``).
    The temporary exists (empty) when the block starts.

    Args:
        path: the file to write.
        suffix: str ending the temporary's name.
        expected_size: bytes the file should take, for the error message
            (default: the size of the ``path`` being replaced, if any).

    Raises:
        OSError: ``errno.ENOSPC`` from ``no_space_error`` (naming ``path``
            and the space needed and free) when the block fails because
            the file system is full; other exceptions pass unchanged.

    Example:

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_file(folder / "a.txt") as tmp:
    ...     _ = tmp.write_text("done")
    >>> (folder / "a.txt").read_text()
    'done'
    """
    path = pathlib.Path(path)
    try:
        tmp = _temp_name(path, suffix)
    except OSError as error:
        if is_no_space_error(error):
            raise no_space_error(path, expected_size or tree_bytes(path)) from error
        raise
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as error:
        written = tree_bytes(tmp)
        tmp.unlink(missing_ok=True)
        if is_no_space_error(error):
            raise no_space_error(path, expected_size or tree_bytes(path),
                                 written) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path, data, encoding="utf-8"):
    """Writes ``data`` (``str`` as ``encoding``, or ``bytes``) to ``path``
    atomically; creates the parent folders. Returns ``path`` as a
    ``pathlib.Path``.

    Raises:
        TypeError: ``data`` is neither ``str`` nor ``bytes`` (nothing is
            written).
        OSError: ``errno.ENOSPC`` naming ``path``, the size of ``data`` and
            the space free, when the file system is full (``path`` is left
            as it was, no temporary remains).

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
    with atomic_file(path, expected_size=memoryview(data).nbytes) as tmp:
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
def atomic_directory(path, exist_ok=False, expected_size=None):
    """Context manager yielding an empty temporary folder beside ``path``;
    on a clean exit it is renamed to ``path``, on an exception (any) it is
    deleted (``path`` untouched).

    Args:
        path: the folder to create, e.g. ``export/<name>/<version>``.
        exist_ok: if True an existing ``path`` is replaced (removed just
            before the rename); if False it is an error.
        expected_size: bytes the folder should take, for the error message
            (e.g. the previous export version's size), or None (the size of
            ``path`` being replaced, if any).

    Raises:
        FileExistsError: ``path`` exists and ``exist_ok`` is False (checked
            before and after the block).
        OSError: ``errno.ENOSPC`` from ``no_space_error`` (naming ``path``
            and the space needed and free) when the block fails because
            the file system is full -- also when the writer reported it
            another way, e.g. TensorFlow's ``ResourceExhaustedError``.

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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = pathlib.Path(tempfile.mkdtemp(dir=path.parent,
                                            prefix=f".tmp-{path.name}-"))
        usual_permissions(tmp)
    except OSError as error:
        if is_no_space_error(error):
            raise no_space_error(path, expected_size or tree_bytes(path)) from error
        raise
    try:
        yield tmp
        if path.exists():
            if not exist_ok:
                raise FileExistsError(f"`path` {str(path)!r} already exists")
            shutil.rmtree(path)
        os.rename(tmp, path)
    except BaseException as error:
        written = tree_bytes(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if is_no_space_error(error):
            raise no_space_error(path, expected_size or tree_bytes(path),
                                 written) from error
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
