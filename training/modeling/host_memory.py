"""Host memory that a freed tensor gives back: glibc's malloc with a fixed mmap threshold.

torch's CPU tensors come from malloc. glibc serves a request above its mmap threshold with a mapping of its own,
unmapped when freed, and smaller ones from its heaps, which keep freed memory for reuse. The threshold starts at
128 KiB but is dynamic: each freed mapping raises it to that mapping's size, up to 32 MiB. The first freed
(chunk, V) logits or embedding gradient therefore moves every later tensor under 32 MiB, such as a long row's
activations (8k tokens x 768 x 4 bytes is 25 MiB), onto the heaps. Freed between layers and micro-batches, that
memory stays in the process's RSS, which is what a container's memory limit and the kernel's OOM killer count: in
an 8k-token SFT step at V = 151,936 it was a quarter of the step's peak (docs/results.md).

`return_freed_memory()` fixes the threshold (mallopt M_MMAP_THRESHOLD), which also turns the dynamic
adjustment off: a tensor of 1 MiB or more is always its own mapping and is returned when freed. Every stage
calls it when it starts (training.stage.run_stage). The cost is a fresh, zero-filled mapping for each such
tensor; benchmarks/long_context.py measures it with the rest of the step. Where the C library is not glibc
(macOS, musl), or MALLOC_MMAP_THRESHOLD_ is already in the environment (an operator's own choice, read by glibc
at start), nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("posttrain")

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
DEFAULT_THRESHOLD = 1 << 20
ENV = "POSTTRAIN_MMAP_THRESHOLD"  # bytes; 0 leaves glibc's dynamic threshold as it is


def return_freed_memory(threshold: int | None = None) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes (default $POSTTRAIN_MMAP_THRESHOLD, else 1 MiB).
    Returns whether it was set: False off glibc, with the threshold 0, or where MALLOC_MMAP_THRESHOLD_ is set."""
    if threshold is None:
        threshold = int(os.environ.get(ENV, DEFAULT_THRESHOLD))
    if threshold <= 0 or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    libc = _glibc()
    if libc is None:
        return False
    if not libc.mallopt(M_MMAP_THRESHOLD, threshold):
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) was refused; freed host memory may stay in the heap", threshold)
        return False
    return True


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "gnu_get_libc_version"):
        return None  # musl, macOS: their allocators have no mallopt of this meaning
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
