"""Keys typed while `msa chat` answers: a terminal echoes them into the answer (an arrow key
shows as `^[[A` in the middle of it) and keeps them for the next prompt. While an answer
prints, echo is off; what was typed meanwhile is dropped when it ends, and the terminal's
settings are restored however it ends (Ctrl-C included)."""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def typed_keys_ignored(stream=None):
    """Within the block, keys typed on the terminal `stream` (stdin) are neither echoed nor
    kept; anything but a terminal (a pipe, a file, Windows) is left alone. Ctrl-C still
    interrupts: signals stay on."""
    stream = sys.stdin if stream is None else stream
    try:
        import termios

        fd = stream.fileno()
        saved = termios.tcgetattr(fd) if stream.isatty() else None
    except (ImportError, OSError, ValueError, AttributeError):
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    # local modes: no echo of what is typed, and no line editing (typed keys are bytes to drop,
    # not a line being edited)
    quiet[3] &= ~(termios.ECHO | termios.ECHONL | termios.ICANON)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcflush(fd, termios.TCIFLUSH)  # the keys typed meanwhile, unread: dropped
        termios.tcsetattr(fd, termios.TCSANOW, saved)
