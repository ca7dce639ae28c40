"""`use_fast_allocator()`: which allocator a command re-executes itself with, and that the re-executed
process really runs on it: mimalloc reuses freed memory without page faults, glibc's huge-page tunable
puts large buffers on 2 MB pages, and the programs it starts inherit neither."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle.common.allocator import ADDED, HUGETLB, allocator_env, glibc_version, mimalloc_library, thp_mode

GLIBC = (2, 36)
LIB = Path("/venv/cmeel.prefix/lib/libmimalloc.so")
MIMALLOC = {"LD_PRELOAD": str(LIB), "MIMALLOC_PURGE_DELAY": "-1", ADDED: "LD_PRELOAD,MIMALLOC_PURGE_DELAY"}
HUGE = {"GLIBC_TUNABLES": f"{HUGETLB}=1", ADDED: ""}


@pytest.mark.parametrize("env, lib, mode, glibc, expected", [
    ({}, LIB, "madvise", GLIBC, MIMALLOC),
    ({"EAGLE_ALLOCATOR": "mimalloc"}, LIB, "never", None, MIMALLOC),
    ({"MIMALLOC_PURGE_DELAY": "100"}, LIB, "madvise", GLIBC,  # the user's own setting stays, and in the child
     {"LD_PRELOAD": str(LIB), ADDED: "LD_PRELOAD"}),
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, LIB, "madvise", GLIBC, None),  # the user's preload is kept
    ({"EAGLE_ALLOCATOR": "system"}, LIB, "madvise", GLIBC, None),
    ({}, None, "madvise", GLIBC, HUGE),  # no mimalloc wheel: glibc's huge pages
    ({}, None, "always", GLIBC, HUGE),
    ({"EAGLE_ALLOCATOR": "hugepages"}, LIB, "madvise", GLIBC, HUGE),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, None, "madvise", GLIBC,
     {"GLIBC_TUNABLES": f"glibc.malloc.trim_threshold=1:{HUGETLB}=1", ADDED: ""}),
    ({"GLIBC_TUNABLES": f"{HUGETLB}=0"}, None, "madvise", GLIBC, None),  # the user's choice, or already done
    ({"EAGLE_ALLOCATOR": "mimalloc"}, None, "madvise", GLIBC, None),
    ({}, None, "never", GLIBC, None),
    ({}, None, None, GLIBC, None),  # no transparent huge pages in this kernel
    ({}, None, "madvise", (2, 31), None),  # a glibc without the tunable
    ({}, None, "madvise", None, None),  # musl
])
def test_which_allocator_a_command_re_executes_with(env, lib, mode, glibc, expected):
    assert allocator_env(env, lib, mode, glibc) == expected


def test_a_gpu_host_keeps_its_allocator_unless_asked():
    assert allocator_env({}, LIB, "madvise", GLIBC, gpu=True) is None
    assert allocator_env({"EAGLE_ALLOCATOR": "mimalloc"}, LIB, "madvise", GLIBC, gpu=True) == MIMALLOC


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="EAGLE_ALLOCATOR='jemalloc'"):
        allocator_env({"EAGLE_ALLOCATOR": "jemalloc"}, LIB, "madvise", GLIBC)


def test_thp_mode_reads_the_bracketed_choice(tmp_path):
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    assert thp_mode(path) == "madvise"
    assert thp_mode(tmp_path / "absent") is None


# A command's first statement; then 256 MB made, written, freed and made again, as a training step's
# tensors are; the kernel's own counts of the page faults of the second round and of the huge pages.
SCRIPT = """
import json, os, resource, subprocess, sys
from eagle.common.allocator import use_fast_allocator
use_fast_allocator()

def step():
    buffer = bytearray(256 << 20)
    buffer[::4096] = b"x" * len(buffer[::4096])
    rollup = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup") if ":" in line)
    return int(rollup["AnonHugePages"].split()[0])

step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
huge_kb = step()
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD', ''))"],
                       capture_output=True, text=True).stdout.strip()
print(json.dumps({"argv": sys.argv[1:], "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
                  "huge_kb": huge_kb, "mimalloc": "libmimalloc" in open("/proc/self/maps").read(),
                  "tunables": os.environ.get("GLIBC_TUNABLES", ""), "child_preload": child}))
"""
PAGES = (256 << 20) // 4096


def run_script(tmp_path, **env) -> dict:
    script = tmp_path / "command.py"
    script.write_text(SCRIPT)
    mine = ("GLIBC_TUNABLES", "EAGLE_ALLOCATOR", "LD_PRELOAD", "MIMALLOC_PURGE_DELAY", ADDED)
    child_env = {k: v for k, v in os.environ.items() if k not in mine}
    out = subprocess.run([sys.executable, str(script), "a=1", "b"], env={**child_env, **env},
                         capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


@pytest.mark.skipif(mimalloc_library() is None, reason="needs the cmeel-mimalloc wheel (requirements.txt)")
def test_a_command_runs_on_mimalloc_and_reuses_freed_memory(tmp_path):
    got = run_script(tmp_path)
    assert got["mimalloc"] and got["argv"] == ["a=1", "b"], got  # the same command line after exec
    assert got["faults"] < PAGES // 20, got  # the second 256 MB came from the first, not from the kernel
    assert got["child_preload"] == "", got  # programs it starts get the user's environment
    system = run_script(tmp_path, EAGLE_ALLOCATOR="system")
    assert not system["mimalloc"] and system["faults"] >= PAGES // 2, system  # glibc: every page again


@pytest.mark.skipif(thp_mode() not in ("always", "madvise") or (glibc_version() or (0, 0)) < (2, 35),
                    reason="needs transparent huge pages and glibc >= 2.35")
def test_without_mimalloc_large_buffers_get_huge_pages(tmp_path):
    got = run_script(tmp_path, EAGLE_ALLOCATOR="hugepages")
    assert got["tunables"] == f"{HUGETLB}=1" and not got["mimalloc"], got
    assert got["huge_kb"] >= 2048, got  # at least one 2 MB page behind the buffer
    if thp_mode() == "madvise":  # only malloc's madvise asks for them in this mode
        system = run_script(tmp_path, EAGLE_ALLOCATOR="system")
        assert system["huge_kb"] < got["huge_kb"], (system, got)
