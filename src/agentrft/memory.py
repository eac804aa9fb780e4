"""Process memory: hand freed heap back to the OS between training phases, and read peak RSS.

The sampler's engine thread and the trainer's main thread allocate from different glibc
arenas. Memory one phase frees (the KV caches of a rollout) stays mapped in its arena
and cannot serve the other thread's allocations, so without a trim the resident set is
the *sum* of the phases' peaks instead of their maximum. The sampler's engine also trims around each
admission (`samplers/hf.py`), where it rebuilds its KV cache at a new size. `trim()` costs ~1 ms on a
small heap, ~15 ms on the engine's multi-GB one (64 level-3 episodes: 4 s over ~290 calls).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource
import sys


@functools.cache
def _malloc_trim() -> object | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


def trim() -> bool:
    """Return freed heap memory of every malloc arena to the OS; False where unsupported."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)  # type: ignore[operator]
    return True


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
