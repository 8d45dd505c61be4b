"""What the benchmarks share: the host they ran on, the date, the code of a
git revision as an importable tree, and the result file. The standard
library only (``bench/gpu_train.py`` must not import TensorFlow).

    >>> from bench import common
    >>> sorted(common.host_info())[:3]
    ['cpu_count', 'cpu_flags', 'cpu_model']
"""

import datetime
import json
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The instruction-set extensions the figures depend on (oneDNN, XLA and
# CTranslate2 pick kernels by them): vector widths, FMA, int8 and bf16 dots.
ISA_FLAGS = ("avx", "fma", "f16c", "amx", "vnni", "bf16", "sse4")


def cpu_model():
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def host_info():
    """The host a figure was measured on: name, CPU model, CPU count, the
    ISA flags of ``ISA_FLAGS``, platform, Python and the load average."""
    info = {"name": platform.node(), "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(), "cpu_flags": [],
            "platform": platform.platform(), "python": platform.python_version(),
            "load_average": list(os.getloadavg())}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                info["cpu_flags"] = sorted(f for f in line.split(":", 1)[1].split()
                                           if any(k in f for k in ISA_FLAGS))
                break
    except OSError:
        pass
    return info


def now():
    """The local date and time, to the second (ISO 8601)."""
    return datetime.datetime.now().isoformat(timespec="seconds")


def git(*args, root=ROOT):
    """``git <args>`` in ``root``; its stdout, stripped."""
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                          text=True).stdout.strip()


def tree_at(revision, root=ROOT, cache=None):
    """The code at ``revision`` as a folder whose ``keras_trm`` a child process
    imports (``PYTHONPATH=<folder>``).

    Args:
        revision: a git revision of ``root`` (``main``, ``c009446``,
            ``HEAD~2``), exported once with ``git archive`` into ``cache``
            (default ``$TMPDIR/keras_trm_trees``) under its full commit id;
            or an existing folder (``.``: this checkout as it is, edits
            included), used as it is.

    Returns:
        ``(folder, commit)``: the folder (absolute) and the commit id (None
        for a folder).

    Raises:
        ValueError: ``revision`` is neither a folder nor a commit of ``root``.
    """
    if pathlib.Path(revision).is_dir():
        return pathlib.Path(revision).resolve(), None
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}", root=root)
    except subprocess.CalledProcessError:
        raise ValueError(f"revision: not a folder nor a commit of {root}: {revision!r}")
    cache = pathlib.Path(cache or pathlib.Path(tempfile.gettempdir()) / "keras_trm_trees")
    folder = cache / commit
    if not folder.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        partial = pathlib.Path(tempfile.mkdtemp(prefix=f".{commit[:12]}_", dir=cache))
        try:
            archive = subprocess.run(["git", "archive", commit], cwd=root, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(partial)], input=archive, check=True)
            partial.rename(folder)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return folder, commit


def write_result(path, result):
    """``result`` as indented JSON (UTF-8), written to a temporary file beside
    ``path`` and renamed over it: a reader never sees half a file."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n",
                       encoding="utf-8")
    os.replace(partial, path)
    return path
