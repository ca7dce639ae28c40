"""The memory allocator of a CPU job: `use_fast_allocator()` starts `python -m train` and `python -m data_prep`.

glibc's malloc serves every request above 32 MB with a fresh `mmap` and gives it back with `munmap`
on free. A training step makes several GB of such tensors (an EAGLE-3 head's logits, softmaxes and
their gradients over 16,384 draft tokens for 4,096 positions, once per training-time-test pass), so
each step the kernel faults in and zeroes them again, 4 KB at a time: 45-60 M page faults and a third
of the process's CPU time in the kernel over a 30-step run on 2 cores (docs/training.md, "Memory
allocator"). Two remedies, best first:

- `mimalloc`: Microsoft's allocator from the pinned `cmeel-mimalloc` wheel, preloaded, keeping the
  pages it frees for the next request (`MIMALLOC_PURGE_DELAY=-1`): a step reuses the last step's
  memory, with no fault and no zeroing: 1.7x glibc's training tokens/s there, and a lower peak.
- `hugepages`: glibc's tunable `glibc.malloc.hugetlb=1` (glibc >= 2.35, transparent huge pages on):
  the same mappings, faulted in 2 MB at a time: 1.3x. Used where mimalloc's library is missing.

Both act only from a process's start, so the command re-executes itself once, before it imports
torch (`exec` keeps the process id, open files and arguments: torchrun and Slurm still see the rank
they started). The new process then takes mimalloc's variables out of its environment again, so the
programs it starts (a vLLM engine, compilers) run as the user's environment says.

    use_fast_allocator()   # first statement of a CLI's `__main__`

`EAGLE_ALLOCATOR` chooses: `auto` (the default: mimalloc, else hugepages; `system` on a host with a GPU,
where the large tensors live in torch's caching GPU allocator), `mimalloc`, `hugepages` or `system` (as
the process was started). A library the user preloads (`LD_PRELOAD`) is kept as it is.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

CHOICES = ("auto", "mimalloc", "hugepages", "system")
MIMALLOC_ENV = {"MIMALLOC_PURGE_DELAY": "-1"}  # never return freed pages to the kernel: reuse them
HUGETLB = "glibc.malloc.hugetlb"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")  # "always [madvise] never"
MIN_GLIBC = (2, 35)  # the first glibc with glibc.malloc.hugetlb
ADDED = "EAGLE_ALLOCATOR_ADDED"  # the variables the re-execution added, for the new process to take out
GPU_DEVICES = (Path("/dev/nvidiactl"), Path("/dev/kfd"))  # NVIDIA's and AMD's (ROCm) device nodes


def mimalloc_library() -> Path | None:
    """libmimalloc.so of the installed `cmeel-mimalloc` wheel, or None."""
    try:
        dist = importlib.metadata.distribution("cmeel-mimalloc")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name == "libmimalloc.so":
            path = Path(dist.locate_file(file))
            return path if path.is_file() else None
    return None


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the running glibc, or None under another C library."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, OSError, ValueError):
        return None


def thp_mode(path: Path = THP_MODE) -> str | None:
    """The kernel's transparent-huge-page mode (`always`, `madvise`, `never`), None where it has none."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def allocator_env(env: dict[str, str], mimalloc: Path | None, thp: str | None,
                  glibc: tuple[int, int] | None, gpu: bool = False) -> dict[str, str] | None:
    """The variables to re-execute with, or None when the process runs as it is."""
    choice = env.get("EAGLE_ALLOCATOR", "auto")
    if choice not in CHOICES:
        raise ValueError(f"EAGLE_ALLOCATOR={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "system" or (choice == "auto" and gpu) or env.get("LD_PRELOAD"):
        return None
    if choice in ("auto", "mimalloc") and mimalloc is not None:
        added = {"LD_PRELOAD": str(mimalloc), **{k: v for k, v in MIMALLOC_ENV.items() if k not in env}}
        return {**added, ADDED: ",".join(added)}
    tunables = env.get("GLIBC_TUNABLES", "")
    if choice == "mimalloc" or HUGETLB in tunables:
        return None
    if thp not in ("always", "madvise") or glibc is None or glibc < MIN_GLIBC:
        return None
    return {"GLIBC_TUNABLES": f"{tunables}:{HUGETLB}=1" if tunables else f"{HUGETLB}=1", ADDED: ""}


def use_fast_allocator() -> None:
    """Re-execute this command once with the allocator `allocator_env` picks (see the module's doc);
    in the re-executed process, take the variables it added back out of the environment."""
    if ADDED in os.environ:
        for name in filter(None, os.environ.pop(ADDED).split(",")):
            os.environ.pop(name, None)
        return
    if sys.platform != "linux":
        return
    gpu = any(device.exists() for device in GPU_DEVICES)
    added = allocator_env(dict(os.environ), mimalloc_library(), thp_mode(), glibc_version(), gpu)
    if added is None:
        return
    os.environ.update(added)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
