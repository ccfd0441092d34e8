"""A chat as its user sees it, whether the local engine (`chat.LocalChat`) or a server
(`remote_session.RemoteChatSession`) answers: the /commands, the terminal's REPL, the
one-question-a-line mode for scripts. Free of PyTorch, so `msa chat --server` starts at once."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from msa.models.errors import MsaError
from msa.models.private_files import private_file

from ..engine.documents import Context
from .output import source_line, write_stdout
from .typed_keys import typed_keys_ignored
from .visible import visible

if TYPE_CHECKING:
    from ..engine import Usage

HELP = """\
/help          this list
/reset         forget the conversation, keep the documents
/context       the documents loaded
/sources       the passages the last answer read
/stats         tokens, cache hits, speed
/save FILE     write the conversation to FILE (Markdown)
/exit          leave (or Ctrl-D)"""


@dataclass
class Turn:
    question: str
    answer: str
    sources: list
    timings: Usage | None  # the local engine's figures (None when a server answered)
    stopped: bool = False


class Conversation:
    """Documents and turns; a subclass answers (`ask`), forgets (`reset`) and counts (`stats`)."""

    def __init__(self, context: Context):
        self.context = context
        self.turns: list[Turn] = []

    def ask(self, question: str) -> Iterator[str]:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def after_answer(self) -> None:
        """Called once an answer is written out (the local engine's --verbose prints its
        figures)."""

    def stats(self) -> str:
        raise NotImplementedError

    def context_lines(self) -> str:
        lines = [f"{f.path}" for f in self.context.files]
        lines += [f"(skipped {path}: {reason})" for path, reason in self.context.skipped]
        return "\n".join(visible(line) for line in lines)

    def sources_lines(self) -> str:
        if not self.turns:
            return "no answer yet"
        return "\n".join(source_line(s) for s in self.turns[-1].sources) or "no sources"

    def markdown(self) -> str:
        out = [
            "# msa chat",
            "",
            "Documents: " + ", ".join(f"`{f.path}`" for f in self.context.files),
            "",
        ]
        for turn in self.turns:
            out += [
                f"**Question:** {turn.question}",
                "",
                turn.answer.strip() + (" *(stopped)*" if turn.stopped else ""),
                "",
            ]
            if turn.sources:
                out += (
                    ["Sources:", ""]
                    + [
                        f"- `{s.path}` lines {s.start_line}-{s.end_line} ({s.score:.2f})"
                        for s in turn.sources
                    ]
                    + [""]
                )
        return "\n".join(out)


def command(session: Conversation, line: str) -> str | None:
    """Run a /command; returns what to print, or None to leave the chat."""
    name, _, arg = line.strip().partition(" ")
    arg = arg.strip()
    if name in ("/exit", "/quit"):
        return None
    if name == "/help":
        return HELP
    if name == "/reset":
        session.reset()
        return "conversation forgotten; the documents stay loaded"
    if name == "/context":
        return session.context_lines()
    if name == "/sources":
        return session.sources_lines()
    if name == "/stats":
        return session.stats()
    if name == "/save":
        if not arg:
            return "usage: /save FILE"
        try:
            Path(arg).expanduser().write_text(session.markdown(), encoding="utf-8")
        except OSError as e:
            return f"cannot write {arg}: {e.strerror}"
        return f"saved to {arg}"
    return f"unknown command {name} (try /help)"


def take_line(session: Conversation, line: str) -> bool:
    """Run a /command or answer a question, on stdout; False when the line ends the chat."""
    if line.startswith("/"):
        reply = command(session, line)
        if reply is None:
            return False
        write_stdout(reply + "\n")
        return True
    for piece in session.ask(line):
        write_stdout(piece)
    write_stdout("\n")
    session.after_answer()
    return True


def run_scripted(session: Conversation, lines) -> None:
    """stdin is not a terminal: one question (or /command) per line, plain answers on stdout."""
    for raw in lines:
        line = raw.strip()
        if line and not take_line(session, line):
            return


def run_repl(
    session: Conversation, history_file: Path, *, terminal_input=None, terminal_output=None
) -> None:
    """A terminal: line editing and history; Ctrl-C stops an answer, Ctrl-D leaves.
    (`terminal_input`/`terminal_output`: prompt_toolkit's, for tests.)"""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory

    private_file(history_file)  # the questions asked: for the user's eyes only
    prompt = PromptSession(
        history=FileHistory(str(history_file)), input=terminal_input, output=terminal_output
    )
    print("Ask about the documents; /help lists commands, Ctrl-D leaves.", file=sys.stderr)
    while True:
        try:
            line = prompt.prompt("> ").strip()
        except KeyboardInterrupt:
            continue
        except EOFError:
            return
        if not line:
            continue
        try:
            with typed_keys_ignored():  # keys pressed while it answers stay out of the answer
                if not take_line(session, line):
                    return
        except KeyboardInterrupt:
            write_stdout("\n")
            print("(stopped)", file=sys.stderr)
        except MsaError as e:
            print(f"msa: error: {e}", file=sys.stderr)
