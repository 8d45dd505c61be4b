"""Returning a process's freed memory to the system."""

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_freed_memory():
    """Collects garbage, then returns the C allocator's free pages to the
    system (glibc's ``malloc_trim(0)``; a no-op elsewhere): memory freed by
    a finished phase (an unloaded model version, a training step's graphs)
    otherwise stays in the malloc arenas, counted in the process's RSS.

    Returns:
        bool: True if ``malloc_trim`` ran.

    Example:
        >>> release_freed_memory() in (True, False)
        True
    """
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
