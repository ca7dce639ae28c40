"""One OpenMP team at a time: `release_team()` frees the calling thread's OpenMP workers.

torch's CPU kernels and inductor's compiled C++ run their parallel loops on OpenMP (libgomp on
Linux). libgomp gives every thread that starts a parallel region its own team of workers, kept
alive until that thread exits. While a process holds more such workers than it has cores, libgomp
makes every idle worker sleep at once instead of spinning (`GOMP_SPINCOUNT` cannot change that
limit), so each of a forward's hundreds of parallel regions pays a futex wake-up. A background
thread that ran one compiled forward and then waits is enough: on 2 cores the main thread's
compiled plain step took 50-81 ms beside it instead of 25-29 ms, and a step timed in the
background thread while the main thread's team was alive 43-56 ms (`python -m
evaluation.thread_teams`).

So the background work (eagle/tuning/background.py) releases its team before it waits for the
model to be idle, and the model releases its own when it hands the cores to that work: whichever
thread runs next builds a fresh team (one `pthread_create` per worker, well under a millisecond)
and has the cores alone.

    release_team()      # this thread's workers end now; its next parallel region starts new ones

`omp_pause_resource_all` (OpenMP 5.0) does the freeing: libgomp drops the calling thread's pool
and the count that makes the others sleep. Other runtimes, and processes without libgomp, get a
no-op (LLVM's libomp pauses the whole runtime instead, which is not wanted here).
"""

from __future__ import annotations

import ctypes
import functools
import os

LIBGOMP = "libgomp.so.1"
OMP_PAUSE_HARD = 2  # omp_pause_resource_t: libgomp frees the calling thread's pool for either kind


@functools.cache
def _pause_resource_all():
    """libgomp's `omp_pause_resource_all` when this process has loaded libgomp, else None."""
    try:
        lib = ctypes.CDLL(LIBGOMP, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # only if torch loaded it
        pause = lib.omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause


def release_team() -> bool:
    """End the calling thread's OpenMP workers (outside any parallel region); True when libgomp did."""
    pause = _pause_resource_all()
    return pause is not None and pause(OMP_PAUSE_HARD) == 0
