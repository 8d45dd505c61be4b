"""Process-level settings for the command-line entry points (not for library
code: they change process-wide state, the environment and fd 2).

A training step allocates and frees the same ~100 MiB tensors (logits and
their gradients) over and over; glibc maps each such block afresh with
``mmap``, one page fault per 4 KiB, and the job spends a good share of its
CPU time in the kernel. ``ALLOCATOR_SETTINGS`` (one arena, no ``mmap``,
freed memory kept) reuse the blocks from the heap (``bench/bench_translation.py``
at 32da1ca, ``epoch_cpu``; docs/measurements.md). :func:`tune_allocator`
sets them with ``mallopt``, since glibc reads ``GLIBC_TUNABLES`` only at a
process start. :func:`quiet_tensorflow_start` keeps TensorFlow's C++
start-up lines off a command's first screen; :func:`is_command_process`
tells ``keras_trm/__init__.py`` not to import TensorFlow before the command
has read its flags (``keras-trm --help`` in a fraction of a second).
"""

import contextlib
import ctypes
import glob
import os
import platform
import re
import sys
import tempfile

# Not mmap_threshold=32 MiB alone (about 20% fewer faults: non-main arenas
# still map large blocks), nor glibc.malloc.hugetlb=1 (100x fewer faults but
# 3x the kernel time, huge page compaction); mmap_max=0 needs arena_max=1.
# trim_threshold: the most ``mallopt`` takes (a C int), 2 GiB.
# name: (mallopt's parameter number in glibc's malloc.h, value)
ALLOCATOR_SETTINGS = {
    "arena_max": (-8, 1),
    "mmap_max": (-4, 0),
    "trim_threshold": (-1, 2 ** 31 - 1),
    "top_pad": (-2, 256 * 2 ** 20),
}
# The same settings as glibc reads them at a process start (child processes).
ALLOCATOR_TUNABLES = ":".join(f"glibc.malloc.{name}={value}"
                              for name, (_, value) in ALLOCATOR_SETTINGS.items())


def _is_glibc_linux():
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def tune_allocator():
    """Sets ``ALLOCATOR_SETTINGS`` in this process (``mallopt``) and
    ``GLIBC_TUNABLES=ALLOCATOR_TUNABLES`` for the processes it starts, on
    glibc Linux, unless ``GLIBC_TUNABLES`` or ``KERAS_TRM_NO_MALLOC_TUNING``
    is set. Call it before the threads that allocate start: a thread that
    already has its own arena keeps it.

    Returns:
        Whether the settings were applied.

    Example:
    >>> import os, unittest.mock
    >>> with unittest.mock.patch.dict(os.environ, KERAS_TRM_NO_MALLOC_TUNING="1"):
    ...     tune_allocator()   # turned off
    False
    """
    if ("GLIBC_TUNABLES" in os.environ or os.environ.get("KERAS_TRM_NO_MALLOC_TUNING")
            or not _is_glibc_linux()):
        return False
    libc = ctypes.CDLL(None)  # the C library this process runs with
    for parameter, value in ALLOCATOR_SETTINGS.values():
        if not libc.mallopt(parameter, value):
            return False  # refused (an old glibc): leave the environment alone
    os.environ["GLIBC_TUNABLES"] = ALLOCATOR_TUNABLES
    return True


def is_command_process(argv=None, orig_argv=None):
    """Whether this process is the ``keras-trm`` command: its console
    script, ``python -m keras_trm.cli`` or a ``recipes/*.py`` script
    (``argv`` default ``sys.argv``, ``orig_argv`` default
    ``sys.orig_argv``). ``keras_trm/__init__.py`` then imports its
    submodules when used, so that ``--help`` does not start TensorFlow.

    Example:
    >>> is_command_process(["/usr/bin/keras-trm", "--help"])
    True
    >>> is_command_process(["-m"], ["python", "-m", "keras_trm.cli", "serve"])
    True
    >>> is_command_process(["recipes/language_model.py", "--corpus", "ptb"])
    True
    >>> is_command_process(["notebook.py"])
    False
    """
    argv = sys.argv if argv is None else argv
    if not argv:
        return False
    name = re.sub(r"(-script\.pyw?|\.exe)$", "", os.path.basename(argv[0]))
    if name == "keras-trm" or (
            os.path.basename(os.path.dirname(os.path.abspath(argv[0]))) == "recipes"
            and name.endswith(".py")):
        return True
    if argv[0] != "-m":  # the module of ``python -m`` not found yet
        return False
    orig_argv = list(getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv)
    for option, value in zip(orig_argv, orig_argv[1:] + [""]):
        if option.startswith("-m"):
            return (option[2:] or value) == "keras_trm.cli"
    return False


# TensorFlow 2.21's C++ start-up lines that ``TF_CPP_MIN_LOG_LEVEL`` does not
# reach (written before absl's logging is set up): info and warning lines,
# absl's notice, and the continuation of cpu_feature_guard's message.
_START_UP_NOISE = re.compile(
    rb"[IW]\d{4} \d\d:\d\d:\d\d"
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|To enable the following instructions: ")


@contextlib.contextmanager
def _filtered_stderr(noise):
    """File descriptor 2 goes to a temporary file for the block; afterwards
    its lines that do not match ``noise`` are written to stderr, in order."""
    if sys.stderr is not None:
        sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as capture:
            os.dup2(capture.fileno(), 2)
            try:
                yield
            finally:
                if sys.stderr is not None:
                    sys.stderr.flush()
                os.dup2(saved, 2)
                capture.seek(0)
                os.write(2, b"".join(line for line in capture.read().splitlines(True)
                                     if not noise.match(line)))
    finally:
        os.close(saved)


class _QuietLoader:
    """Runs the loader of ``tensorflow`` with ``_filtered_stderr``."""

    def __init__(self, loader, finder):
        self.loader, self.finder = loader, finder

    def __getattr__(self, name):  # create_module, is_package, ...
        return getattr(self.loader, name)

    def exec_module(self, module):
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self.finder)  # the first import only
        module.__loader__ = module.__spec__.loader = self.loader  # TensorFlow's own
        with _filtered_stderr(_START_UP_NOISE):
            self.loader.exec_module(module)


class _QuietTensorFlowImport:
    """``sys.meta_path`` finder: the other finders' spec of ``tensorflow``
    with ``_QuietLoader``, which removes this finder when TensorFlow is
    imported (not on a mere ``importlib.util.find_spec``)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _QuietLoader(spec.loader, self)
                return spec
        return None


def quiet_tensorflow_start():
    """Keeps TensorFlow's C++ log lines off a command's screen, unless the
    user set ``TF_CPP_MIN_LOG_LEVEL`` (then it does nothing).

    Sets ``TF_CPP_MIN_LOG_LEVEL`` (read when TensorFlow loads; inherited by
    child processes): 3 where there is no NVIDIA driver (TensorFlow 2.21
    logs spurious errors on a CPU host, e.g. ``failed call to cuInit``;
    errors that stop a command reach the user as Python exceptions), 2
    where there is one, for a failure to use the GPU is news there.
    TensorFlow's start-up block ignores the variable, so the first
    ``import tensorflow`` runs with file descriptor 2 captured and what it
    wrote, less those lines, is written out afterwards.

    Returns:
        Whether the defaults were set (False: the user's level stands).

    Example:
    >>> import os, unittest.mock
    >>> with unittest.mock.patch.dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0"):
    ...     quiet_tensorflow_start()   # the user's level stands
    False
    """
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return False
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2" if has_nvidia_driver() else "3"
    if "tensorflow" not in sys.modules and not any(
            isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())
    return True


def has_nvidia_driver():
    """Whether an NVIDIA driver is loaded (``/proc/driver/nvidia``, a
    ``/dev/nvidia*`` device).

    Example:
    >>> isinstance(has_nvidia_driver(), bool)
    True
    """
    return os.path.exists("/proc/driver/nvidia") or bool(glob.glob("/dev/nvidia*"))


def quiet_cuda_probe():
    """Lets TensorFlow list its devices once with stderr silenced, where
    there is no NVIDIA driver (with one, a failure is news).

    Without a driver TensorFlow's CUDA build logs ``failed call to cuInit``
    at ERROR level the first time it lists its devices, whatever
    ``CUDA_VISIBLE_DEVICES`` or the log level (TensorFlow 2.21); it keeps
    that list, so later device queries log nothing.

    Example:
    >>> quiet_cuda_probe()  # the first device list, silently on a CPU host
    """
    if has_nvidia_driver():
        return
    try:
        import tensorflow as tf
    except ImportError:  # a machine without TensorFlow: nothing to quiet
        return

    with _filtered_stderr(re.compile(b"")):  # every line is noise
        tf.config.list_physical_devices()
