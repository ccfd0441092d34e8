"""Waiting on what a test started: `msa` in a process of its own, started as a terminal starts
it, and a wait for an event (a file, a flag, a server's answer) with a limit generous enough
for a loaded 2-core machine. No test waits a fixed time."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable

# A test that works waits seconds; two copies of the suite on a loaded 2-core machine can take
# minutes where one alone takes seconds. Reaching the limit means the event never came.
LIMIT_S = 300

# `msa` as a shell runs a command in the foreground, where Ctrl-C (SIGINT) raises
# KeyboardInterrupt. Python installs that handler only where SIGINT is at its default, and a
# process started with SIGINT ignored passes that on: a suite run in the background of a
# non-interactive shell (`python -m pytest &`, as a CI script starting two copies does) would
# start `msa` deaf to the tests' Ctrl-C.
_AS_FROM_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('msa.app', run_name='__main__', alter_sys=True)"
)


def start_msa(*args, **popen) -> subprocess.Popen:
    """`msa ARGS` in a new process (it inherits this test's isolated HOME and XDG directories),
    its stdout and stderr piped as text."""
    return subprocess.Popen(
        [sys.executable, "-c", _AS_FROM_A_TERMINAL, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def wait_until(
    condition: Callable[[], bool],
    what: str,
    *,
    process: subprocess.Popen | None = None,
    thread: threading.Thread | None = None,
    limit_s: float = LIMIT_S,
) -> None:
    """Return once `condition()` holds. Fail naming `what` after `limit_s` seconds, or as soon
    as the `process` or `thread` that was to bring it about has ended without it."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if process is not None and process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"{what}: the process ended ({process.returncode}) first: {err}")
        assert thread is None or thread.is_alive(), f"{what}: the thread ended first"
        assert time.monotonic() < deadline, f"{what}: not within {limit_s} s"
        time.sleep(0.02)  # how often to look, not how long to wait
