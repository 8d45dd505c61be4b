"""Where data lives: one setting, resolved in one documented order.

1. an explicit ``data_dir`` argument (the ``--data-dir`` flag of the CLI and
   recipes);
2. the environment variable ``KERAS_TRM_DATA_DIR``;
3. ``../shared/data`` beside the checkout (the folder that holds
   ``keras_trm/``'s parent), then ``./data`` under the current directory;
4. ``~/keras_trm_data`` (where online downloads are cached).

An explicit choice (1 or 2) that does not exist is an error; of 3 and 4
the first existing one is used, worked out at each call
(``default_candidates``), so ``./data`` is the current directory's.
"""

import os
import pathlib

ENV_VAR = "KERAS_TRM_DATA_DIR"
_CHECKOUT = pathlib.Path(__file__).resolve().parents[2]


def default_candidates():
    """The folders (a tuple of ``pathlib.Path``) tried when neither
    ``data_dir`` nor the environment names one, in order; the last, the
    download cache, is ``resolve_data_dir(must_exist=False)``'s fallback."""
    return (_CHECKOUT.parent / "shared" / "data", pathlib.Path.cwd() / "data",
            pathlib.Path.home() / "keras_trm_data")


def resolve_data_dir(data_dir=None, must_exist=True):
    """Returns the data directory as a ``pathlib.Path``.

    Args:
        data_dir: str/path or None. Explicit choice (highest priority).
        must_exist: if True, raise when nothing is found.

    Raises:
        FileNotFoundError: ``data_dir`` (or ``$KERAS_TRM_DATA_DIR``) given
            but missing, or a file (even with ``must_exist=False``), or no
            default candidate exists (every path tried named).
    """
    env = os.environ.get(ENV_VAR)
    if data_dir is not None or env:
        path = pathlib.Path(data_dir if data_dir is not None else env).expanduser()
        if (must_exist or path.exists()) and not path.is_dir():
            setting = (f"data_dir={str(path)!r}" if data_dir is not None
                       else f"{ENV_VAR}={env!r}")
            raise FileNotFoundError(f"{setting} does not exist or is not a directory")
        return path
    candidates = default_candidates()
    found = next((path for path in candidates if path.is_dir()), None)
    if found is None and must_exist:
        tried = ", ".join(str(p) for p in candidates)
        raise FileNotFoundError(
            f"No data directory found: pass data_dir / --data_dir, set "
            f"{ENV_VAR}, or create one of: {tried}")
    return found or candidates[-1]
