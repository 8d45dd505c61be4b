"""Process-level settings for the command-line entry points.

glibc's malloc hands every block above its mmap threshold (at most 32 MiB,
adjusted as the program runs) to the kernel with ``mmap`` and gives it back
with ``munmap`` when freed, and it trims the top of its heaps back to the
kernel when more than ``trim_threshold`` is free. A training step allocates
and frees the same large tensors (the (tokens, vocabulary) logits and their
gradients are ~100 MiB each) over and over, so each step the kernel maps
fresh zeroed pages and the process takes one page fault per 4 KiB: the
Multi30k job took ~97 million minor faults and spent ~7-10% of its CPU
time in the kernel. ``ALLOCATOR_TUNABLES`` raise both thresholds (the mmap
one to glibc's maximum, 32 MiB) so that freed memory below it stays in the
process and is reused. Blocks above 32 MiB are still mapped afresh: glibc
cannot keep them, which is why the gain is modest (about 20% fewer faults).

glibc reads ``GLIBC_TUNABLES`` only when a process starts, so an entry point
calls :func:`reexec_with_allocator_tunables` first thing: when the variable
is absent, it re-executes the same command once with it set (the variable,
now present, stops a second re-exec). A user's own ``GLIBC_TUNABLES`` is
left alone; ``KERAS_TRM_NO_REEXEC=1`` turns the re-exec off. Not for library
code: it replaces the running process (a notebook kernel would restart).
"""

import os
import platform
import sys

# Measured with bench/bench_translation.py (epoch_cpu). Not
# glibc.malloc.hugetlb=1: it cut the page faults 100x (673,562 -> 6,408 in
# 10 steps) but tripled the kernel time (1.8 -> 6.1 s; transparent huge
# page compaction), a net loss.
ALLOCATOR_TUNABLES = (
    "glibc.malloc.mmap_threshold=33554432"
    ":glibc.malloc.trim_threshold=1073741824"
    ":glibc.malloc.top_pad=268435456"
)


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
    ``KERAS_TRM_NO_REEXEC`` is set, off glibc Linux, or when the original
    command line is unknown (an interactive session, ``python -c``). Otherwise it does not return: ``os.execve``
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
    if not changed or len(argv) < 2 or not sys.executable:
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + argv[1:], env)
