"""C++ extensions built for the CPU they run on: our kernels (the decoder's GEMV, the reply engine's attention).

    ext = native_extension("eagle_gemv_bf16", Path(".../gemv_bf16.cpp"))   # built once per source and CPU kind

Built with `-march=native` (the CPU's own vector instructions) and OpenMP (torch's threads run the kernels)
into torch's extensions cache at first use (~15-20 s), then loaded from it. The build is named by `cpu_key()`,
so a home folder shared by nodes of different CPUs never hands one node's binary to another, and by the source's
path (`path_key`): torch's `build.ninja` names the source, so two checkouts on one machine (a CI clone beside the
working tree) sharing a folder rewrote it in turn and rebuilt at every switch.

torch guards each build (and each load: it runs ninja to check the build is current) with a file, `lock` in
the build's folder, which it waits for while it exists; a process killed in there (Ctrl-C while a first
chat loads, a job stopped) leaves the file behind, and every later process waited forever without a word.
Our loads take an flock first (`in_turn`: the system drops it with its process), so a `lock` found while
holding it is such a leftover, and goes.

ninja keeps a hash of each build command in the folder's `.ninja_log`, and ninja 1.11 (a system package) and
1.13 (requirements.txt's) hash the same command differently: each saw the other's build as out of date, so a
process started with the virtualenv active (its ninja first on PATH) after one started without (the system's
first) rebuilt both kernels, ~30 s each, before its first token. Our loads run the ninja of the `ninja` package
we pin (`_pinned_ninja`), whatever PATH holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import threading
from functools import cache
from pathlib import Path

from eagle.common.locks import in_turn

log = logging.getLogger("eagle")
TORCH_LOCK = "lock"  # torch's build lock in the build folder (torch.utils.file_baton)
TURN = "eagle-build.flock"  # ours beside it

_PATH_LOCK = threading.Lock()  # one load at a time changes os.environ["PATH"]
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]  # OpenMP: the kernels' threads, in torch's libgomp


def cpu_key() -> str:
    """A digest of this CPU's model and instruction sets."""
    lines = _cpuinfo()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2] or lines[:1]
    return hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:10]


@cache
def cpu_flags() -> frozenset[str]:
    """The first CPU's instruction-set flags (`avx512_bf16`, `amx_bf16`, ...); empty where /proc/cpuinfo is not.
    Parsed once: the decoder asks at every greedy step (eagle/compiled/gemv.py `screened_argmax`)."""
    line = next((line for line in _cpuinfo() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


@cache
def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return [platform.processor()]


def native_extension(stem: str, source: Path):
    """The extension of `source` built for this CPU, named `stem`, `cpu_key()` and `path_key(source)`. Raises
    where it cannot be built."""
    from torch.utils import cpp_extension

    folder = build_folder(stem, source)
    with in_turn(folder / TURN), _pinned_ninja():
        _drop_leftover_lock(folder)
        return cpp_extension.load(folder.name, [str(source)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                                  verbose=False)


@contextlib.contextmanager
def _pinned_ninja():
    """PATH with the pinned `ninja` package's folder first while torch runs `ninja` (unchanged without the
    package: torch then finds one on PATH or says it has none)."""
    try:
        import ninja
    except ImportError:
        yield
        return
    with _PATH_LOCK:
        before = os.environ.get("PATH", "")
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, before]) if before else ninja.BIN_DIR
        try:
            yield
        finally:
            os.environ["PATH"] = before


def path_key(source: Path) -> str:
    """A short digest of the source file's absolute path."""
    return hashlib.sha256(str(Path(source).resolve()).encode()).hexdigest()[:6]


def build_folder(stem: str, source: Path) -> Path:
    """torch's build folder of the extension `stem` of `source` on this CPU (named `stem`, `cpu_key()` and
    `path_key(source)`)."""
    from torch.utils import cpp_extension

    return Path(cpp_extension._get_build_directory(f"{stem}_{cpu_key()}_{path_key(source)}", verbose=False))


def _drop_leftover_lock(folder: Path) -> None:
    """Remove torch's build lock in `folder`, called while holding our turn: no live load of ours holds it."""
    lock = folder / TORCH_LOCK
    if lock.exists():
        log.warning("%s: removing the build lock a process stopped while building left behind", lock)
        lock.unlink(missing_ok=True)


def optional_extension(stem: str, source: Path, logger: logging.Logger, instead: str):
    """`native_extension`, or None where it cannot be built (no compiler, a failed build: the torch path it replaces
    is exact, only slower), with a warning in `logger` naming the source and what runs `instead`."""
    try:
        return native_extension(stem, source)
    except Exception as error:
        logger.warning("%s not built (%s); %s", source.name, str(error).splitlines()[0], instead)
        return None
