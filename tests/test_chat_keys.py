"""`msa chat` on a real terminal (a pty): keys pressed while it answers are neither echoed into
the answer nor left for the next prompt, and the terminal's echo is back afterwards."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from processes import LIMIT_S, wait_until

pytestmark = pytest.mark.slow

UP = "\x1b[A"  # the up arrow, as a terminal sends it; echoed, it shows as ^[[A
QUESTION = "Tell a long story."
# greedy, the embedded model answers it about harbor-town.txt without an end: seconds of answer
# to type into
ANSWER_TOKENS = 400
# prompt_toolkit turns bracketed paste on as each prompt opens
PROMPT_OPENS = "\x1b[?2004h"


class Terminal:
    """A process on a pty: what it has written so far, and keys typed to it."""

    def __init__(self, args: list[str]):
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            args,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env={**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1"},  # no cursor-position questions
        )
        os.close(slave)
        self.seen = ""

    def read(self) -> str:
        """Everything written since the start (reads what is there now, never blocks long)."""
        import select

        while select.select([self.master], [], [], 0.05)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the process ended and closed its side
                break
            if not chunk:
                break
            self.seen += chunk.decode(errors="replace")
        return self.seen

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def wait_for(self, text: str, after: int = 0, limit_s: float = LIMIT_S) -> int:
        """Where `text` appears after offset `after`, once it has."""
        try:
            wait_until(
                lambda: text in self.read()[after:],
                repr(text),
                process=self.process,
                limit_s=limit_s,
            )
        except AssertionError as e:
            raise AssertionError(f"{e}; the terminal shows {self.seen[after:][-600:]!r}") from None
        return self.seen.index(text, after)


def test_keys_typed_while_chat_answers_are_not_echoed_nor_kept(embedded):
    doc = Path(__file__).resolve().parent.parent / "examples" / "harbor-town.txt"
    code = "from msa.app import main; main()"
    term = Terminal([sys.executable, "-c", code, "chat", "-c", str(doc), "-n", str(ANSWER_TOKENS)])
    try:
        term.wait_for(PROMPT_OPENS)
        term.type(QUESTION + "\r")
        # the answer is streaming: plain text after the last escape sequence (prompt_toolkit's)
        wait_until(
            lambda: len(term.read().rsplit("\x1b", 1)[-1].strip()) > 40,
            "the answer began",
            process=term.process,
        )
        typed_at = len(term.seen)
        term.type(UP + UP)
        after = term.wait_for(PROMPT_OPENS, typed_at)  # the next prompt: the answer is over
        answer = term.seen[typed_at:after]
        assert "^[[A" not in answer and UP not in answer, answer
        # nothing typed during the answer waits at the prompt: the up arrows would have brought
        # the question back into the line, and this would be a question, not /stats
        term.type("/stats")
        term.wait_for("/stats", after)
        term.type("\r")
        term.wait_for("last answer:", after)
        term.type("\x04")  # Ctrl-D on an empty line leaves
        assert term.process.wait(timeout=LIMIT_S) == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()
            term.process.wait()
        os.close(term.master)
