"""Process-level settings for the command-line entry points.

glibc's malloc hands every block above its mmap threshold (at most 32 MiB)
to the kernel with ``mmap`` and gives it back with ``munmap`` when freed,
and threads other than the main one allocate from extra arenas, each a
64 MiB mapped heap, which cannot hold a larger block and so map it afresh
whatever the threshold. A training step allocates and frees the same large
tensors (the (tokens, vocabulary) logits and their gradients are ~100 MiB
each) over and over, so each step the kernel maps fresh zeroed pages and
the process takes one page fault per 4 KiB, and a training job spends a
good share of its CPU time in the kernel.
``ALLOCATOR_TUNABLES`` make every thread allocate from the main arena
(``arena_max=1``), never ``mmap`` a block (``mmap_max=0``: the heap grows
with ``brk``), and keep freed memory (``trim_threshold`` 4 GiB): the large
blocks are reused from the heap. ``bench/bench_translation.py`` at 32da1ca
(``epoch_cpu``) measures the effect on page faults, kernel time and epoch
time (``bench/results/translation_cpu_epoch.json``, docs/measurements.md).

glibc reads ``GLIBC_TUNABLES`` only when a process starts, so an entry point
calls :func:`reexec_with_allocator_tunables` first thing: when the variable
is absent, it re-executes the same command once with it set (the variable,
now present, stops a second re-exec). A user's own ``GLIBC_TUNABLES`` is
left alone; ``KERAS_TRM_NO_REEXEC=1`` turns the re-exec off. Not for library
code: it replaces the running process (a notebook kernel would restart).
"""

import glob
import os
import platform
import sys

# Measured with bench/bench_translation.py at 32da1ca (epoch_cpu). Neither of the
# earlier choices: mmap_threshold=32 MiB alone (about 20% fewer faults: the
# blocks above it, and all blocks of non-main arenas, are still mapped) nor
# glibc.malloc.hugetlb=1 (100x fewer faults but 3x the kernel time,
# transparent huge page compaction). mmap_max=0 without arena_max=1 changes
# nothing: the worker threads' arenas map large blocks regardless.
ALLOCATOR_TUNABLES = (
    "glibc.malloc.arena_max=1"
    ":glibc.malloc.mmap_max=0"
    ":glibc.malloc.trim_threshold=4294967296"
    ":glibc.malloc.top_pad=268435456"
)

# Flags after which an entry point prints and exits without training.
PRINT_ONLY_FLAGS = frozenset({"-h", "--help", "--print_config"})


def _is_glibc_linux():
    if platform.system() != "Linux":
        return False
    libc, _ = platform.libc_ver()
    return libc == "glibc"


def allocator_env(environ=None):
    """The environment a training process should run with: ``environ``
    (default ``os.environ``) plus ``GLIBC_TUNABLES=ALLOCATOR_TUNABLES``
    where it is absent, on glibc Linux only.

    Returns:
        ``(env, changed)``: a new dict and whether it differs from ``environ``.

    Example:
    >>> env, changed = allocator_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    >>> env["GLIBC_TUNABLES"], changed
    ('glibc.malloc.arena_max=2', False)
    """
    env = dict(os.environ if environ is None else environ)
    if ("GLIBC_TUNABLES" in env or env.get("KERAS_TRM_NO_REEXEC")
            or not _is_glibc_linux()):
        return env, False
    env["GLIBC_TUNABLES"] = ALLOCATOR_TUNABLES
    return env, True


def reexec_with_allocator_tunables(argv=None):
    """Re-executes this Python process once with ``GLIBC_TUNABLES`` set.

    Returns (doing nothing) where the variable is already set, where
    ``KERAS_TRM_NO_REEXEC`` is set, off glibc Linux, when the original
    command line is unknown (an interactive session, ``python -c``), or
    when it only prints (``-h``, ``--help``, ``--print_config``: no
    training, so no second start of TensorFlow, which took 3.5 s of a
    recipe's 7 s ``--help``). Otherwise it does not return: ``os.execve``
    runs ``sys.executable`` with the same arguments (``sys.orig_argv``, so
    ``python -m keras_trm.cli ...``, ``keras-trm ...`` and
    ``python recipes/x.py ...`` all come back as they were called).

    Args:
        argv: the full command line to re-run, interpreter options included
            (default ``sys.orig_argv``; ``argv[0]`` is replaced by
            ``sys.executable``).

    Example:
    >>> import os
    >>> os.environ["KERAS_TRM_NO_REEXEC"] = "1"
    >>> reexec_with_allocator_tunables() is None   # returns, no re-exec
    True
    >>> del os.environ["KERAS_TRM_NO_REEXEC"]
    """
    env, changed = allocator_env()
    if argv is None:
        if sys.argv[:1] in ([""], ["-c"]):
            return None  # an interactive session or ``python -c``: not re-run
        argv = getattr(sys, "orig_argv", [])
    argv = list(argv)
    if (not changed or len(argv) < 2 or not sys.executable
            or PRINT_ONLY_FLAGS.intersection(argv[1:])):
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + argv[1:], env)


def set_log_level_default(environ=None):
    """Sets ``TF_CPP_MIN_LOG_LEVEL=2`` (TensorFlow's C++ warnings and info
    lines off, errors on) in ``environ`` (default ``os.environ``) unless the
    user set it. TensorFlow reads the variable once, when it is imported, so
    it only takes effect in a process that imports TensorFlow afterwards
    (the re-executed training process, a subprocess).

    Example:
    >>> env = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    >>> set_log_level_default(env)["TF_CPP_MIN_LOG_LEVEL"]
    '0'
    """
    environ = os.environ if environ is None else environ
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return environ


def has_nvidia_driver():
    """Whether an NVIDIA driver is loaded (``/proc/driver/nvidia``, a
    ``/dev/nvidia*`` device).

    Example:
    >>> isinstance(has_nvidia_driver(), bool)
    True
    """
    return (os.path.exists("/proc/driver/nvidia")
            or bool(glob.glob("/dev/nvidia*")))


def quiet_cuda_probe():
    """Lets TensorFlow look for GPUs with stderr silenced, where there is no
    NVIDIA driver; does nothing where there is one.

    TensorFlow's CUDA build calls ``cuInit`` the first time it lists its
    devices; without a driver that fails and logs, at ERROR level (which
    ``TF_CPP_MIN_LOG_LEVEL=2`` keeps),
    ``E0000 ... cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA
    error: Failed call to cuInit: UNKNOWN ERROR (303)``, then runs on the CPU.
    Neither ``CUDA_VISIBLE_DEVICES=""`` nor the log level set after import
    removes the line (checked with TensorFlow 2.21), so an entry point calls
    this first: the device list is made once with file descriptor 2 pointed
    at ``/dev/null``, and TensorFlow keeps it, so the
    later device queries log nothing. With a driver present a failure is
    news, so nothing is hidden.

    Example:
    >>> quiet_cuda_probe()  # the first device list, silently on a CPU host
    """
    if has_nvidia_driver():
        return
    import tensorflow as tf

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
