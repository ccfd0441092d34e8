"""Keep freed memory in the process for the next prefill chunk, rather than giving it back to the
kernel at once.

glibc's malloc serves a block of 128 kB or more (a threshold it raises as such blocks are freed,
up to 32 MB) by mmap, and unmaps it when it is freed; smaller blocks come from its heap, whose
top it returns to the kernel past 128 kB free. Prefill frees and allocates the same large
tensors again and again (a chunk's activations, 16-64 MB; the weight tiles it multiplies), so
each one was fresh pages, zeroed by the kernel on first touch: 11% of a 512-token prefill of a
1B model was page faults (perf). Served from a heap that is kept, the same prefill ran 1.2-1.4x
faster on 2 cores (2026-12-03, Llama-3.2-1B shape Q4_K_M: 239 -> 320 tok/s at 512 tokens, 228
-> 263 at 2K; Qwen2.5-0.5B 558 -> 645 at 2K), with the same peak memory: what is kept is what
the next chunk allocates again.

Blocks up to KEEP_BYTES come from the heap, and up to KEEP_BYTES of free heap stay mapped.
Larger blocks (the K/V cache of a long document) are still mapped on their own and given back
when freed. Set once, at load; a user who tunes malloc (MALLOC_*_ or GLIBC_TUNABLES in the
environment) keeps their own settings. Other C libraries are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import platform

KEEP_BYTES = 1 << 30

# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_applied: bool | None = None


def user_tunes_malloc(environ=os.environ) -> bool:
    return "GLIBC_TUNABLES" in environ or any(
        name.startswith("MALLOC_") and name.endswith("_") for name in environ
    )


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed blocks up to KEEP_BYTES for reuse (once per process);
    whether the settings are in force."""
    global _applied
    if _applied is None:
        _applied = False
        if platform.libc_ver()[0] == "glibc" and not user_tunes_malloc():
            mallopt = ctypes.CDLL(None).mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _applied = bool(mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(
                mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES)
            )
    return _applied
