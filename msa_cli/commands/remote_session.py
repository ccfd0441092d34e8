"""`msa ask` and `msa chat` with `--server`: the same documents and prompts, answered by a server.
Free of PyTorch, like everything this path imports, so a client starts at once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from ..engine.documents import Context
from ..engine.prompt import user_message
from .options import DEFAULT_MODEL
from .output import write_stdout
from .remote import RemoteAnswer, Server
from .repl import Conversation, Turn

LOCAL_ONLY_SOURCES = "sources need the local engine (msa chat without --server)"


@dataclass
class Sampling:
    """What the request asks of the server's answer."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    system: str | None

    def request(self) -> dict:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
        }


def connect(server: str, api_key: str | None, timeout: float, model: str):
    """The --server, and the model to ask it for: --model when it serves it, else (when
    --model was left at its default) its only one."""
    remote = Server(server, api_key=api_key, timeout=timeout)
    return remote, remote.model(model, chosen=model != DEFAULT_MODEL)


def ask_remote(
    server: Server,
    model: str,
    context: Context,
    question: str,
    sampling: Sampling,
    *,
    json_out: bool,
    started_at: float,
) -> None:
    """Stream the server's answer to stdout, or print one JSON object at the end."""
    answer, pieces = server.stream_chat(
        first_messages(sampling, context, question), model=model, **sampling.request()
    )
    for piece in pieces:
        if not json_out:
            write_stdout(piece)
    if json_out:
        print(
            json.dumps(answer.as_json(server=server.url, started_at=started_at), ensure_ascii=False)
        )
    else:
        write_stdout("\n")


class RemoteChatSession(Conversation):
    """A chat whose turns a server answers: the whole conversation is sent each turn, the
    documents first, so the server's prefix cache holds everything but the newest question."""

    def __init__(self, server: Server, model: str, context: Context, sampling: Sampling):
        super().__init__(context)
        self.server, self.model, self.sampling = server, model, sampling
        self.messages: list[dict] = []
        self.last: RemoteAnswer | None = None

    def reset(self) -> None:
        self.messages.clear()
        self.turns.clear()

    def ask(self, question: str) -> Iterator[str]:
        if self.messages:
            messages = self.messages + [{"role": "user", "content": question.strip()}]
        else:
            messages = first_messages(self.sampling, self.context, question)
        answer, pieces = self.server.stream_chat(
            messages, model=self.model, **self.sampling.request()
        )
        turn = Turn(question, "", [], None, stopped=True)
        try:
            for piece in pieces:
                turn.answer += piece
                yield piece
            turn.stopped = False
        finally:
            if turn.answer or not turn.stopped:  # an answer that never began leaves no turn
                self.messages = messages + [{"role": "assistant", "content": turn.answer}]
                self.turns.append(turn)
                self.last = answer

    def sources_lines(self) -> str:
        return LOCAL_ONLY_SOURCES

    def stats(self) -> str:
        lines = [
            f"documents: {len(self.context.files):,} files, "
            f"answered by {self.model} at {self.server.url}",
            f"conversation: {len(self.turns)} turns",
        ]
        a = self.last
        if a is not None and a.prompt_tokens is not None:
            cached = (
                ""
                if a.cached_tokens is None
                else f" ({a.cached_tokens:,} from the server's prefix cache)"
            )
            lines.append(
                f"last answer: {a.prompt_tokens:,} prompt tokens{cached}, "
                f"{a.generated_tokens or 0:,} written"
            )
        return "\n".join(lines)


def first_messages(sampling: Sampling, context: Context, question: str) -> list[dict]:
    """The messages `msa ask` reads on the local engine (`prompt.build_prompt`)."""
    system = [{"role": "system", "content": sampling.system}] if sampling.system else []
    return system + [{"role": "user", "content": user_message(context.text, question)}]
