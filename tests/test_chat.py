"""`python -m eagle.chat`: piped turns, the shared tree flags, and its one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.tiny import ROOT


def chat(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle.chat", *args], input=stdin, capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_piped_turns_stream_replies_with_the_tree_flags(tiny_dir):
    out = chat("--target", str(tiny_dir), "--random-head", "--dtype", "float32", "--max-new-tokens", "6",
               "--total-token", "8", "--depth", "3", "--draft-top-k", "4", "--lookup", "4", stdin="Hi\nAnd again\n")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.count("[tau ") == 2  # one statistics line per reply
    first, second = re.findall(r"(\d+) of them cached", out.stderr)
    assert first == "0" and int(second) > 10  # the second turn prefills its new message only


def test_a_missing_head_is_one_clear_line(tmp_path):
    out = chat("--head", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "no draft head at" in out.stderr


def test_the_default_dtype_is_bf16_only_where_the_cpu_computes_in_it(tiny_dir):
    from eagle.common.precision import native_bf16

    out = chat("--target", str(tiny_dir), "--random-head", "--max-new-tokens", "2", "--total-token", "4", "--depth", "2",
               stdin="Hi\n")
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"loading the target ({'bfloat16' if native_bf16() else 'float32'})" in out.stderr
