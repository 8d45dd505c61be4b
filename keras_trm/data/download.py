"""Downloads for the loaders: checked, atomic, bounded in time (an
interrupted or corrupt download never leaves a file under the final name,
so the next run downloads again instead of reading half a corpus).
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

    The bytes stream into a temporary file beside ``path``, renamed into
    place once complete and checked.

    Args:
        url: str, an ``http(s)://`` or ``file://`` URL.
        path: str or ``pathlib.Path``, the destination (its folder is
            created).
        sha256: optional hex digest the downloaded bytes must have.
        timeout: float, seconds a connection may stay silent.

    Returns:
        ``pathlib.Path`` of ``path``.

    Raises:
        ValueError: the bytes' SHA-256 is not ``sha256`` (URL and both
            digests named). OSError: the download failed (unreachable host,
            HTTP error, a connection dropped early; the URL named). Either
            way nothing is written, and folders created are removed again.

    Example:

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.txt").write_text("Hallo")
    >>> fetch((d / "a.txt").as_uri(), d / "copy" / "a.txt").read_text()
    'Hallo'
    """
    path = pathlib.Path(path)
    created = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    if created:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        print(f"downloading {url} -> {path}", file=sys.stderr, flush=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                   suffix=".part")
        usual_permissions(tmp)  # mkstemp's 0600 stays on the renamed file
        digest = hashlib.sha256()
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
                raise OSError(f"downloading {url} failed: the connection closed after "
                              f"{received} of {expected} bytes")
            out.flush()
            os.fsync(out.fileno())
        if sha256 is not None and digest.hexdigest() != sha256.lower():
            raise ValueError(f"{url} has SHA-256 {digest.hexdigest()}, expected {sha256}: "
                             "corrupt or changed download, not kept")
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            pathlib.Path(tmp).unlink(missing_ok=True)
        for folder in created:  # deepest first: a failure leaves no empty folder
            try:
                folder.rmdir()
            except OSError:
                break  # not empty: its parents are not empty either
        raise
    return path
