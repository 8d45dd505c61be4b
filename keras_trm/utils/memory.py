"""Returning a process's freed memory to the system."""

import ctypes
import ctypes.util
import gc

_LIBC = None


def release_freed_memory():
    """Collects garbage, then returns the C allocator's free pages to the
    system (glibc's ``malloc_trim(0)``; a no-op elsewhere).

    Without it, memory freed by a finished phase (an unloaded model
    version, a training step's graphs) stays in the process's malloc arenas
    (one per thread that allocated), counted in its RSS, and a later phase
    that allocates from other arenas adds to it.

    Returns:
        bool: True if ``malloc_trim`` ran.

    Example:
        >>> release_freed_memory() in (True, False)
        True
    """
    global _LIBC
    gc.collect()
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            _LIBC = ctypes.CDLL(name) if name else False
        except OSError:
            _LIBC = False
    trim = getattr(_LIBC, "malloc_trim", None) if _LIBC else None
    if trim is None:
        return False
    trim(0)
    return True
