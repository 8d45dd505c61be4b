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

glibc reads ``GLIBC_TUNABLES`` only when a process starts, so a command
calls :func:`tune_allocator` first thing instead: it sets the same values
in the running process with ``mallopt`` (no second process start), before
any worker thread has an arena of its own, and puts them in
``GLIBC_TUNABLES`` for the processes it starts. A user's own
``GLIBC_TUNABLES`` is left alone; ``KERAS_TRM_NO_MALLOC_TUNING=1`` turns it
off.

:func:`quiet_tensorflow_start` keeps TensorFlow's C++ start-up lines off a
command's first screen; :func:`is_command_process` tells
``keras_trm/__init__.py`` not to import TensorFlow before the command has
read its flags (``keras-trm --help`` in a fraction of a second). Not for
library code: both change process-wide state (the environment, fd 2).
"""

import contextlib
import ctypes
import glob
import importlib.util
import os
import platform
import re
import sys
import tempfile

# Measured with bench/bench_translation.py at 32da1ca (epoch_cpu). Neither of the
# earlier choices: mmap_threshold=32 MiB alone (about 20% fewer faults: the
# blocks above it, and all blocks of non-main arenas, are still mapped) nor
# glibc.malloc.hugetlb=1 (100x fewer faults but 3x the kernel time,
# transparent huge page compaction). mmap_max=0 without arena_max=1 changes
# nothing: the worker threads' arenas map large blocks regardless.
# trim_threshold: the most ``mallopt`` takes (a C int), 2 GiB.
ALLOCATOR_SETTINGS = {
    "arena_max": 1,
    "mmap_max": 0,
    "trim_threshold": 2 ** 31 - 1,
    "top_pad": 256 * 2 ** 20,
}
# The same settings as glibc reads them at a process start (child processes).
ALLOCATOR_TUNABLES = ":".join(f"glibc.malloc.{name}={value}"
                              for name, value in ALLOCATOR_SETTINGS.items())
# mallopt's parameter numbers (glibc's malloc.h).
_MALLOPT_PARAMETERS = {"trim_threshold": -1, "top_pad": -2, "mmap_max": -4,
                       "arena_max": -8}


def _is_glibc_linux():
    if platform.system() != "Linux":
        return False
    libc, _ = platform.libc_ver()
    return libc == "glibc"


def tune_allocator():
    """Sets ``ALLOCATOR_SETTINGS`` in this process (``mallopt``) and
    ``GLIBC_TUNABLES=ALLOCATOR_TUNABLES`` in ``os.environ`` (the processes
    it starts read it), on glibc Linux, unless ``GLIBC_TUNABLES`` is
    already set (the user's own, read at this process's start) or
    ``KERAS_TRM_NO_MALLOC_TUNING`` is. Call it before the threads that
    allocate start: a thread that already has its own arena keeps it.

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
    for name, value in ALLOCATOR_SETTINGS.items():
        if not libc.mallopt(_MALLOPT_PARAMETERS[name], value):
            return False  # refused (an old glibc): leave the environment alone
    os.environ["GLIBC_TUNABLES"] = ALLOCATOR_TUNABLES
    return True


def is_command_process(argv=None, orig_argv=None):
    """Whether this process is the ``keras-trm`` command: its console
    script (``argv[0]`` named ``keras-trm``), ``python -m keras_trm.cli``
    or a script in a ``recipes`` folder (``recipes/*.py``, which start
    through ``keras_trm.cli.run_recipe``; ``argv`` default ``sys.argv``,
    ``orig_argv`` default
    ``sys.orig_argv``). ``keras_trm/__init__.py`` then leaves its
    submodules to be imported when used, so that ``keras-trm --help`` does
    not start TensorFlow (``import keras`` does, on its TensorFlow backend).

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


# TensorFlow's C++ start-up lines that ``TF_CPP_MIN_LOG_LEVEL`` does not
# reach (TensorFlow 2.21 writes them while it loads, before absl's logging
# is set up): info and warning lines, absl's notice, and the continuation
# line of cpu_feature_guard's message.
_START_UP_NOISE = re.compile(
    rb"[IW]\d{4} \d\d:\d\d:\d\d"
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|To enable the following instructions: ")


@contextlib.contextmanager
def _filtered_stderr(noise):
    """File descriptor 2 goes to a temporary file for the block; afterwards
    its lines that do not match ``noise`` are written to stderr, in order
    (Python warnings and C++ errors of the block are kept)."""
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
                kept = [line for line in capture.read().splitlines(keepends=True)
                        if not noise.match(line)]
                if kept:
                    os.write(2, b"".join(kept))
    finally:
        os.close(saved)


class _QuietLoader:
    """Runs the loader of ``tensorflow`` with ``_filtered_stderr``."""

    def __init__(self, loader, finder):
        self.loader, self.finder = loader, finder

    def __getattr__(self, name):  # is_package, get_resource_reader, ...
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self.finder)  # the first import only
        # The module keeps TensorFlow's own loader.
        module.__loader__ = module.__spec__.loader = self.loader
        with _filtered_stderr(_START_UP_NOISE):
            self.loader.exec_module(module)


class _QuietTensorFlowImport:
    """``sys.meta_path`` finder: the spec of ``tensorflow`` that the other
    finders find, with ``_QuietLoader``; it leaves ``sys.meta_path`` when
    TensorFlow is imported (a mere ``importlib.util.find_spec`` does not
    import it)."""

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

    Sets ``TF_CPP_MIN_LOG_LEVEL`` (read once, when TensorFlow loads, so
    call this before anything imports it; processes started later inherit
    it): 3 (C++ errors off too) where there is no NVIDIA driver, 2
    (warnings and info off, errors kept) where there is one, for a failure
    to use the GPU is news there. On a CPU host TensorFlow 2.21 logs
    ``E0000 ... oneDNN supports DT_INT64 only on platforms with AVX-512``
    (on AVX-512 hosts too) and ``failed call to cuInit``; errors that stop
    a command reach the user as Python exceptions. TensorFlow's start-up
    block (``oneDNN custom operations are on``, ``cudart_stub``, absl's
    ``All log messages before absl::InitializeLog()``, twice) ignores the
    variable, so the first ``import tensorflow`` runs with file descriptor
    2 captured, and what it wrote, less those lines, is written out
    afterwards (a crash inside the import loses it).

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
    try:
        import tensorflow as tf
    except ImportError:  # a machine without TensorFlow: nothing to quiet
        return

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
