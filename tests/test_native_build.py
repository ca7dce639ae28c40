"""Our C++ extensions' builds (eagle/common/native_build.py): a build lock that a stopped process left behind is
removed, not waited on forever, and loads of one extension take turns."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

from torch.utils import cpp_extension

import eagle.common.native_build as native_build
from eagle.common.locks import in_turn

SOURCE = """
#include <torch/extension.h>
int64_t twice(int64_t x) { return 2 * x; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""


def test_a_real_build_goes_on_past_a_lock_a_stopped_build_left(tmp_path):
    """torch waits while its `lock` file exists: one left in the folder used to hang every later load, silently."""
    source = tmp_path / "twice.cpp"
    source.write_text(SOURCE)
    script = textwrap.dedent(f"""
        import os
        os.environ["TORCH_EXTENSIONS_DIR"] = {str(tmp_path / "ext")!r}
        from pathlib import Path
        from eagle.common.native_build import build_folder, native_extension
        (build_folder("eagle_twice", Path({str(source)!r})) / "lock").touch()  # what a build killed mid-way leaves
        print(native_extension("eagle_twice", Path({str(source)!r})).twice(21))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split()[-1] == "42"
    assert "removing the build lock" in out.stderr


def test_loads_of_one_extension_take_turns(monkeypatch, tmp_path):
    """A load waits while another process holds the turn (here a thread: flock locks are per open file), and a
    live holder's torch lock is left alone until then."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = native_build.build_folder("eagle_turns", tmp_path / "x.cpp")
    calls = []
    monkeypatch.setattr(cpp_extension, "load", lambda name, *a, **k: calls.append(
        (time.monotonic(), (folder / native_build.TORCH_LOCK).exists())) or name)
    holding, released = threading.Event(), []

    def other_build():
        with in_turn(folder / native_build.TURN):
            (folder / native_build.TORCH_LOCK).touch()  # a live build's lock
            holding.set()
            time.sleep(0.5)
            (folder / native_build.TORCH_LOCK).unlink()
            released.append(time.monotonic())

    thread = threading.Thread(target=other_build)
    thread.start()
    holding.wait()
    name = native_build.native_extension("eagle_turns", tmp_path / "x.cpp")
    thread.join()
    assert name.startswith("eagle_turns_") and len(calls) == 1
    assert calls[0][0] >= released[0] and calls[0][1] is False  # after the other build, its lock gone with it


def test_loads_run_the_pinned_ninja(monkeypatch, tmp_path):
    """torch runs `ninja` from PATH: a load finds the `ninja` package's own first, whichever ninja PATH lists
    first (a system ninja of another version hashes build commands differently and rebuilt every kernel), and
    PATH is as it was afterwards."""
    import shutil

    import ninja

    other = tmp_path / "bin"
    other.mkdir()
    (other / "ninja").write_text("#!/bin/sh\nexit 1\n")
    (other / "ninja").chmod(0o755)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", f"{other}{os.pathsep}{os.environ['PATH']}")
    path = os.environ["PATH"]
    assert shutil.which("ninja") == str(other / "ninja")
    found = []
    monkeypatch.setattr(cpp_extension, "load", lambda name, *a, **k: found.append(shutil.which("ninja")) or name)
    native_build.native_extension("eagle_pinned", tmp_path / "x.cpp")
    assert found == [os.path.join(ninja.BIN_DIR, "ninja")]
    assert os.environ["PATH"] == path


def test_two_copies_of_a_source_build_in_their_own_folders(tmp_path):
    """torch's build.ninja names the source's path: two checkouts sharing one folder rebuilt at every switch."""
    a, b = tmp_path / "a" / "k.cpp", tmp_path / "b" / "k.cpp"
    assert native_build.build_folder("eagle_k", a) != native_build.build_folder("eagle_k", b)
    same = tmp_path / "b" / ".." / "a" / "k.cpp"
    assert native_build.build_folder("eagle_k", a) == native_build.build_folder("eagle_k", same)
