"""Freed large arrays go back to the operating system (glibc), instead of staying in the heap.

glibc serves an allocation of at least M_MMAP_THRESHOLD bytes with its own mmap, returned to
the system when freed; but after such a block is freed, glibc raises the threshold to its size
(up to 32 MB), and later blocks of that size come from the heap, where they are not handed back.
A client's Gram statistics are a few such blocks (784-d: a 4.9 MB float64 matrix, its 1.2 MB
wire form), made once per client: in one process serving 600 in-process clients the heap kept
~2 MB per client (RSS 2.3 GB, 1.1 GB after `malloc_trim`), and 10,000 clients ran out of 24 GB.
A fixed threshold (set explicitly, glibc stops moving it) keeps every block of 1 MiB or more
on its own mmap: RSS 1.1 GB at 600 clients (docs/scale.md). Not lower: the server encodes a
SCAFFOLD correction per client per round (K = 100, D = 1280: 512 kB), and with a 256 kB
threshold each one was a fresh mmap whose pages fault in again, 2.4x the strategy's
configure_train time (benchmarks/results/flower_overhead.md).
"""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
THRESHOLD = 1024 * 1024


def return_large_frees(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes for this process; False where there is
    no glibc (another OS or C library: nothing to do)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
