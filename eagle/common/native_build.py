"""C++ extensions built for the CPU they run on: our kernels (the decoder's GEMV, the reply engine's attention).

    ext = native_extension("eagle_gemv_bf16", Path(".../gemv_bf16.cpp"))   # built once per source and CPU kind

Built with `-march=native` (the CPU's own vector instructions) and OpenMP (torch's threads run the kernels)
into torch's extensions cache at first use (~15-20 s), then loaded from it. The build is named by `cpu_key()`,
so a home folder shared by nodes of different CPUs never hands one node's binary to another.
"""

from __future__ import annotations

import hashlib
import logging
import platform
from functools import cache
from pathlib import Path

FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]  # OpenMP: the kernels' threads, in torch's libgomp


def cpu_key() -> str:
    """A digest of this CPU's model and instruction sets."""
    lines = _cpuinfo()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2] or lines[:1]
    return hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:10]


def cpu_flags() -> set[str]:
    """The first CPU's instruction-set flags (`avx512_bf16`, `amx_bf16`, ...); empty where /proc/cpuinfo is not."""
    line = next((line for line in _cpuinfo() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@cache
def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return [platform.processor()]


def native_extension(stem: str, source: Path):
    """The extension of `source` built for this CPU, named `stem` and `cpu_key()`. Raises where it cannot be built."""
    from torch.utils import cpp_extension

    return cpp_extension.load(f"{stem}_{cpu_key()}", [str(source)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                              verbose=False)


def optional_extension(stem: str, source: Path, logger: logging.Logger, instead: str):
    """`native_extension`, or None where it cannot be built (no compiler, a failed build: the torch path it replaces
    is exact, only slower), with a warning in `logger` naming the source and what runs `instead`."""
    try:
        return native_extension(stem, source)
    except Exception as error:
        logger.warning("%s not built (%s); %s", source.name, str(error).splitlines()[0], instead)
        return None
