"""The default thread count: cores free of other work (msa.engine.idle_cores)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from msa.engine import idle_cores as ic


def snap(wall, idle, own):
    return ic.Snapshot(wall_s=wall, idle_s=idle, own_cpu_s=own)


@pytest.mark.parametrize(
    "idle, own, n_cores, expected",
    [
        (1.0, 1.0, 2, 2),  # the other core idle, this process busy on one: both free
        (0.0, 0.9, 2, 1),  # other work holds a core
        (0.1, 0.5, 2, 1),  # less than one core free still runs one thread
        (0.0, 0.0, 2, 1),
        (1.7, 1.0, 4, 3),  # 2.7 cores: the 0.7 counts
        (1.6, 1.0, 4, 2),  # 2.6: it does not
        (9.0, 0.0, 4, 4),  # never more than the cores
    ],
)
def test_free_cores_counts_idle_time_and_our_own_over_the_window(idle, own, n_cores, expected):
    before, after = snap(10.0, 100.0, 5.0), snap(12.0, 100.0 + 2 * idle, 5.0 + 2 * own)
    assert ic.free_cores(before, after, n_cores) == expected


def test_without_proc_stat_every_core_is_free(tmp_path):
    missing = str(tmp_path / "no-stat")
    assert ic.snapshot({0}, missing).idle_s is None
    assert ic.free_cores(snap(0, None, 0), snap(1, None, 0), 3) == 3


def test_idle_time_is_read_for_the_allowed_cores_only(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  9 9 9 9000 9 0 0 0 0 0\n"
        "cpu0 1 2 3 100 7 0 0 0 0 0\n"
        "cpu1 1 2 3 200 11 0 0 0 0 0\n"
        "cpu2 1 2 3 400 13 0 0 0 0 0\n"
        "intr 5 6 7\n"
        "ctxt 123\n"
    )
    hz = os.sysconf("SC_CLK_TCK")
    assert ic.snapshot({0, 2}, str(stat)).idle_s == pytest.approx((100 + 7 + 400 + 13) / hz)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("200000 100000\n", 2),
        ("150000 100000\n", 2),
        ("50000 100000\n", 1),
        ("max 100000\n", None),
        ("x 0\n", None),
    ],
)
def test_a_containers_cpu_quota_caps_the_cores(tmp_path, text, expected):
    path = tmp_path / "cpu.max"
    path.write_text(text)
    assert ic.cpu_quota(str(path)) == expected
    assert ic.cpu_quota(str(tmp_path / "none")) is None


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux's /proc")
@pytest.mark.skipif(
    ic.cpu_quota() is not None or len(ic.cores()) > 16,
    reason="one spinning process per core: a machine of at most 16 cores, no CPU quota",
)
def test_one_thread_when_other_work_fills_every_core():
    # each spinner says when it starts, and again once it has used half a second of CPU
    spin = (
        "import time\nprint('spinning', flush=True)\nstart = time.process_time()\n"
        "while time.process_time() - start < 0.5: pass\nprint('spun', flush=True)\n"
        "while True: pass"
    )
    hogs = []
    try:
        for core in sorted(ic.cores()):
            hog = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
            hogs.append(hog)
            os.sched_setaffinity(hog.pid, {core})
            assert hog.stdout.readline().strip() == "spinning"
        before = ic.snapshot()
        for hog in hogs:  # the wait is on the spinners' own CPU time, not on a clock
            assert hog.stdout.readline().strip() == "spun"
        assert ic.free_cores(before, ic.snapshot(), len(ic.cores())) == 1
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
