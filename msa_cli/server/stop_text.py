"""A request's `stop` strings: the answer ends before the first of them, which is not returned.

Text that could be the start of a stop string is held back until the next pieces decide it, so
a streamed answer never shows a client the first characters of a stop string.
"""

from __future__ import annotations


class StopText:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""  # text not yet passed on: it may begin a stop string

    def push(self, text: str) -> tuple[str, bool]:
        """The text that may be passed on now, and whether a stop string ended the answer."""
        self.held += text
        found = [i for i in (self.held.find(s) for s in self.stops) if i >= 0]
        if found:
            out, self.held = self.held[: min(found)], ""
            return out, True
        keep = max((self._started(s) for s in self.stops), default=0)
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return out, False

    def flush(self) -> str:
        """The answer ended without a stop string: what was held back is answer text after all."""
        out, self.held = self.held, ""
        return out

    def _started(self, stop: str) -> int:
        """The length of the longest end of the held text that is a start of `stop`."""
        for n in range(min(len(stop) - 1, len(self.held)), 0, -1):
            if self.held.endswith(stop[:n]):
                return n
        return 0
