"""Atomic writes: a file or a folder appears complete or not at all.

Every writer of the package goes through ``atomic_file`` or
``atomic_directory``: the content is written under a temporary name in the
target's own folder and renamed into place (``os.replace`` / ``os.rename``,
atomic on POSIX). A crash leaves the old target (or none) and no
half-written file. A full file system (``ENOSPC``, ``EDQUOT``, or
TensorFlow's "No space left on device") is reported as one ``OSError``
(``errno.ENOSPC``) naming the target and the space needed and free.
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
    return ((isinstance(error, OSError) and error.errno in _NO_SPACE_ERRNOS)
            or any(t in str(error).lower() for t in _NO_SPACE_TEXTS))


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
    return sum(p.lstat().st_size for p in path.rglob("*")
               if p.is_file() and not p.is_symlink())


def no_space_error(path, needed=None, written=None):
    """The ``OSError`` (``errno.ENOSPC``) this package raises when ``path``
    cannot be written because its file system is full, with the space free
    now (for an unprivileged user).

    Args:
        path: the file or folder that was being written.
        needed: expected size in bytes, or None if unknown.
        written: bytes written before the failure (the write needed more),
            used when ``needed`` is unknown; or None.

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
    folder = pathlib.Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    size = f"{format_bytes(shutil.disk_usage(folder).free)} free"
    if needed:
        size = f"needed ~{format_bytes(needed)}, {size}"
    elif written:
        size = f"needed more than {format_bytes(written)}, {size}"
    return OSError(errno.ENOSPC, f"no space left on device writing {path}: {size}")


def _umask():
    """The process's umask, read from ``/proc`` where Linux has it: setting
    it to read it back is process-wide, a race with other threads."""
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
    (a file) or 0777 (a folder) less the umask, not ``mkstemp`` /
    ``mkdtemp``'s 0600 / 0700, which another user (a server) cannot read.

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkstemp()[1])
    >>> usual_permissions(path)
    >>> oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    True
    """
    path = pathlib.Path(path)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_umask())


def _remove(tmp):
    if tmp.is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _temporary(path, expected_size, directory=False, suffix=""):
    """Yields a new temporary file or folder beside ``path``; it is removed
    at the end (the caller renames it into place first) and a full file
    system is reported as ``no_space_error``."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if directory:
            tmp = tempfile.mkdtemp(dir=path.parent, prefix=f".tmp-{path.name}-")
        else:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                       suffix=".tmp" + suffix)
            os.close(fd)
        tmp = pathlib.Path(tmp)
        usual_permissions(tmp)
        yield tmp
    except BaseException as error:
        if not is_no_space_error(error):
            raise
        written = tree_bytes(tmp) if tmp else 0
        if tmp:
            _remove(tmp)  # first: the free space reported is what a retry has
        raise no_space_error(path, expected_size or tree_bytes(path), written) from error
    finally:
        if tmp:
            _remove(tmp)


@contextlib.contextmanager
def atomic_file(path, suffix="", expected_size=None):
    """Context manager yielding a temporary path (an existing empty file)
    beside ``path``; on a clean exit it replaces ``path``, on any exception
    (``KeyboardInterrupt`` too) it is removed and ``path`` is untouched.
    For writers that want a file name (``model.save``, whose format
    follows ``suffix`` such as ``".keras"``).

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
    with _temporary(path, expected_size, suffix=suffix) as tmp:
        yield tmp
        os.replace(tmp, path)


def atomic_write(path, data, encoding="utf-8"):
    """Writes ``data`` (``str`` as ``encoding``, or ``bytes``) to ``path``
    atomically; creates the parent folders. Returns ``path`` as a
    ``pathlib.Path``.

    Raises:
        TypeError: ``data`` is neither ``str`` nor ``bytes``.
        OSError: ``errno.ENOSPC`` naming ``path``, the size of ``data`` and
            the space free, when the file system is full (``path`` is left
            as it was).

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "out" / "hello.txt"
    >>> atomic_write(path, "hi\\n").read_text()
    'hi\\n'
    """
    if isinstance(data, str):
        data = data.encode(encoding)
    elif not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"`data` must be str or bytes, got {type(data).__name__}")
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
    return atomic_write(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_directory(path, exist_ok=False, expected_size=None):
    """Context manager yielding an empty temporary folder beside ``path``;
    on a clean exit it is renamed to ``path``, on any exception it is
    deleted (``path`` untouched).

    Args:
        path: the folder to create, e.g. ``export/<name>/<version>``.
        exist_ok: if True an existing ``path`` is replaced (removed just
            before the rename); if False it is an error.
        expected_size: bytes the folder should take, for the error message
            (default: the size of the ``path`` being replaced, if any).

    Raises:
        FileExistsError: ``path`` exists and ``exist_ok`` is False (checked
            before and after the block).
        OSError: ``errno.ENOSPC`` from ``no_space_error`` (naming ``path``
            and the space needed and free) when the block fails because
            the file system is full, however the writer reported it.

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
    with _temporary(path, expected_size, directory=True) as tmp:
        yield tmp
        if path.exists():
            if not exist_ok:
                raise FileExistsError(f"`path` {str(path)!r} already exists")
            shutil.rmtree(path)
        os.rename(tmp, path)
