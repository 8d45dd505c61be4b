"""Downloads for the loaders: checked, atomic, bounded in time.

``fetch`` streams a URL into a temporary file beside its destination,
checks its SHA-256 when one is known, and only then renames it into place:
an interrupted or corrupt download never leaves a file under the final
name, so the next run downloads again instead of reading half a corpus.
"""

import hashlib
import http.client
import os
import pathlib
import sys
import tempfile
import urllib.error
import urllib.request

from keras_trm.utils.files import usual_permissions

_CHUNK = 1 << 16


def fetch(url, path, sha256=None, timeout=60.0):
    """Downloads ``url`` to ``path``, atomically.

    Args:
        url: str, an ``http(s)://`` or ``file://`` URL.
        path: str or ``pathlib.Path``, the destination; its folder is
            created. An existing file is replaced only by a complete,
            verified download.
        sha256: optional hex digest the downloaded bytes must have.
        timeout: float, seconds a connection may stay silent.

    Returns:
        ``pathlib.Path`` of ``path``.

    Raises:
        ValueError: the bytes' SHA-256 is not ``sha256`` (the message names
            the URL and both digests); nothing is written.
        OSError: the download failed (unreachable host, HTTP error, the
            connection dropped before the announced length); the message
            names the URL; nothing is written, and folders ``fetch``
            created for ``path`` are removed again.

    Example:

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.txt").write_text("Hallo")
    >>> fetch((d / "a.txt").as_uri(), d / "copy" / "a.txt").read_text()
    'Hallo'
    """
    path = pathlib.Path(path)
    created = _make_folders(path.parent)
    try:
        return _fetch(url, path, sha256, timeout)
    except BaseException:
        _remove_empty(created)  # a failed download leaves no empty folder
        raise


def _make_folders(folder):
    """Creates ``folder`` and its missing parents; returns those created,
    deepest first (for ``_remove_empty``)."""
    folder = pathlib.Path(folder)
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    if missing:
        missing[0].mkdir(parents=True, exist_ok=True)
    return missing


def _remove_empty(folders):
    """Removes the ``folders`` (deepest first) that are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break  # not empty (or gone): its parents are not empty either


def _fetch(url, path, sha256, timeout):
    print(f"downloading {url} -> {path}", file=sys.stderr, flush=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                               suffix=".part")
    usual_permissions(tmp)  # mkstemp's 0600 stays on the renamed file
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as reply:
                    expected = reply.headers.get("Content-Length")
                    received = 0
                    while chunk := reply.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        received += len(chunk)
            except (urllib.error.URLError, http.client.HTTPException,
                    OSError, ValueError) as err:
                raise OSError(f"downloading {url} failed: {err}") from err
            if expected is not None and received != int(expected):
                raise OSError(
                    f"downloading {url} failed: the connection closed after "
                    f"{received} of {expected} bytes")
            out.flush()
            os.fsync(out.fileno())
        if sha256 is not None and digest.hexdigest() != sha256.lower():
            raise ValueError(
                f"{url} has SHA-256 {digest.hexdigest()}, expected {sha256}: "
                "corrupt or changed download, not kept")
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path
