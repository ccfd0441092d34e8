"""How many CPU cores are free for msa: the default thread count.

On a 2-core machine where other work keeps the cores busy, two threads are many times slower
than one: each parallel region (hundreds per token) waits for the thread the scheduler parked
behind the other work. Measured on 2 cores at load 7: a 1K-token `msa eval ruler` item took
83-160 s with 2 threads and 15.9 s with 1. So by default msa runs as many threads as there are
cores not busy with other work: from /proc/stat, the idle time of the cores this process may
run on (no more than a container's CPU quota allows), plus this process's own CPU time (its
own work is not other work), over the window since the last measure or, the first time, since
this module was imported (`msa`'s start: importing PyTorch gives a second of it), at least
`MIN_WINDOW_S`. Without /proc/stat (not Linux), every core counts as free.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

MIN_WINDOW_S = 0.1
# a core at least 70% free counts: the parked-thread cost comes from cores that are busy most
# of the time, not from a short burst of other work
ROUND_UP_FROM = 0.7


def cores() -> set[int]:
    """The cores this process may run on."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:
        return set(range(os.cpu_count() or 1))


def cpu_quota(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """The cores a cgroup v2 CPU quota allows (a container started with --cpus=2: 2), rounded
    up; None without one."""
    try:
        with open(path) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError, ZeroDivisionError):  # no cgroup v2 file, or not as documented
        return None


@dataclass(frozen=True)
class Snapshot:
    wall_s: float
    idle_s: float | None  # idle (and I/O wait) seconds of our cores since boot; None: unknown
    own_cpu_s: float  # this process's CPU seconds, every thread


def usable_cores() -> int:
    """The cores this process may run on, no more than a CPU quota allows."""
    allowed = len(cores())
    return min(allowed, cpu_quota() or allowed)


def snapshot(allowed: set[int] | None = None, stat_path: str = "/proc/stat") -> Snapshot:
    idle = _idle_seconds(allowed or cores(), stat_path)
    return Snapshot(time.monotonic(), idle, time.process_time())


def _idle_seconds(allowed: set[int], stat_path: str) -> float | None:
    try:
        with open(stat_path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in allowed:
            ticks += int(fields[3]) + int(fields[4])  # idle, iowait (USER_HZ ticks)
    return ticks / os.sysconf("SC_CLK_TCK")


def free_cores(before: Snapshot, after: Snapshot, n_cores: int) -> int:
    """Cores free over the window between two snapshots: at least 1, at most `n_cores`."""
    wall = after.wall_s - before.wall_s
    if before.idle_s is None or after.idle_s is None or wall <= 0:
        return n_cores
    free = (after.idle_s - before.idle_s + after.own_cpu_s - before.own_cpu_s) / wall
    whole = int(free)
    return max(1, min(n_cores, whole + (free - whole >= ROUND_UP_FROM)))


_last = snapshot()


def idle_cores() -> int:
    """Cores free for msa over the time since the last call (or since import)."""
    global _last
    waited = time.monotonic() - _last.wall_s
    if waited < MIN_WINDOW_S:
        time.sleep(MIN_WINDOW_S - waited)
    allowed = cores()
    now = snapshot(allowed)
    # a CPU quota's cores are not idle for us however idle the machine's are
    n, _last = free_cores(_last, now, usable_cores()), now
    return n
