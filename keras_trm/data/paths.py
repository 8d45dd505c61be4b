"""Where data lives: one setting, resolved in one documented order.

1. an explicit ``data_dir`` argument (the ``--data-dir`` flag of the CLI and
   recipes);
2. the environment variable ``KERAS_TRM_DATA_DIR``;
3. ``../shared/data`` beside the checkout (the folder that holds
   ``keras_trm/``'s parent), then ``./data`` under the current directory;
4. ``~/keras_trm_data`` (where online downloads are cached).

The first candidate that exists wins for 1 and 2 (an explicit choice that
does not exist is an error); for 3 and 4 the first existing one is used.
The candidates of 3 and 4 are worked out at each call
(``default_candidates``), so ``./data`` is the current directory's.
"""

import os
import pathlib

ENV_VAR = "KERAS_TRM_DATA_DIR"
_CHECKOUT = pathlib.Path(__file__).resolve().parents[2]


def default_candidates():
    """The folders tried when neither ``data_dir`` nor the environment
    variable names one, in order: ``../shared/data`` beside the checkout,
    ``./data``, then ``~/keras_trm_data`` (the download cache, returned
    by ``resolve_data_dir(must_exist=False)`` when none exists).

    Returns:
        tuple of ``pathlib.Path``.
    """
    return (
        _CHECKOUT.parent / "shared" / "data",
        pathlib.Path.cwd() / "data",
        pathlib.Path.home() / "keras_trm_data",
    )


def resolve_data_dir(data_dir=None, must_exist=True):
    """Returns the data directory as a ``pathlib.Path``.

    Args:
        data_dir: str/path or None. Explicit choice (highest priority).
        must_exist: if True, raise when nothing is found.

    Raises:
        FileNotFoundError: ``data_dir`` (or ``$KERAS_TRM_DATA_DIR``) given
            but missing, or a file (also with ``must_exist=False``: a
            download could not go there), or none of the default
            candidates exists; the message lists every path tried.
    """
    if data_dir is not None:
        path = pathlib.Path(data_dir).expanduser()
        if (must_exist or path.exists()) and not path.is_dir():
            raise FileNotFoundError(
                f"data_dir={str(path)!r} does not exist or is not a directory"
            )
        return path
    env = os.environ.get(ENV_VAR)
    if env:
        path = pathlib.Path(env).expanduser()
        if (must_exist or path.exists()) and not path.is_dir():
            raise FileNotFoundError(
                f"{ENV_VAR}={env!r} does not exist or is not a directory"
            )
        return path
    candidates = default_candidates()
    for path in candidates:
        if path.is_dir():
            return path
    if must_exist:
        tried = ", ".join(str(p) for p in candidates)
        raise FileNotFoundError(
            f"No data directory found: pass data_dir / --data-dir, set "
            f"{ENV_VAR}, or create one of: {tried}"
        )
    return candidates[-1]
