"""Other processes' share of the CPUs while something is timed (eagle/tuning/machine_load.py)."""

import os
import subprocess
import sys
import time

import pytest

from eagle.tuning import machine_load
from eagle.tuning.machine_load import OthersShare

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc only")
SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass\n"


def _orphans(n: int, seconds: float) -> None:
    """n processes spinning for `seconds`, reparented away from this one (not its descendants)."""
    code = f"import os\nif os.fork(): os._exit(0)\n{SPIN.format(s=seconds)}"
    for _ in range(n):
        subprocess.run([sys.executable, "-c", code], check=True)


def test_other_processes_spinning_make_the_timing_busy(monkeypatch):
    monkeypatch.setattr(machine_load, "BUSY", 0.25)  # the default, which conftest lifts for the other tests
    n = os.cpu_count()
    _orphans(n, 3.0 + 0.1 * n)  # one per CPU, still spinning after the last has started
    time.sleep(0.3)
    with OthersShare() as load:
        time.sleep(1.0)
    assert load.share > 0.25 and load.busy


def test_this_process_children_count_as_its_own_and_others_do_not():
    before = machine_load._tree_jiffies(os.getpid())
    subprocess.run([sys.executable, "-c", SPIN.format(s=1.0)], check=True)  # a child, waited for
    child = machine_load._tree_jiffies(os.getpid()) - before
    _orphans(1, 3.0)
    time.sleep(3.2)
    orphan = machine_load._tree_jiffies(os.getpid()) - before - child
    hz = os.sysconf("SC_CLK_TCK")
    assert child >= 0.2 * hz  # at least a fifth of its second on a CPU, even on a busy machine
    # Counted, the orphan's 3 s would be >= 0.6 s by the same fifth. What is ours: the forking parent's
    # interpreter start-up (a waited child, up to ~0.15 s on a slow CI host) and this process's sleep.
    assert orphan < 0.4 * hz


def test_without_proc_the_share_is_unknown_and_not_busy(monkeypatch, tmp_path):
    monkeypatch.setattr(machine_load, "PROC", tmp_path)
    with OthersShare() as load:
        pass
    assert load.share is None and not load.busy
