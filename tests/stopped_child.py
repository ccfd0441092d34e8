"""Killing a child process where it says it stopped: the tests' kill -9 in the middle of a write.

The child prints "stopped" at the point to test and then blocks; the test waits for that line
(an event, never a fixed time) and kills it with SIGKILL, so no handler or `finally` runs, as
when the machine loses power mid-write (but for the disk's cache)."""

from __future__ import annotations

import signal
import subprocess


def kill_where_it_stops(child: subprocess.Popen, where: str, limit_s: float) -> None:
    try:
        line = child.stdout.readline()
        assert line == "stopped\n", f"the child ended without stopping at {where}: {line!r}"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=limit_s) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
