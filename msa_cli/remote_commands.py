"""`msa ask` and `msa chat` with `--server`: the same documents and prompts, answered by a server."""

from __future__ import annotations

import json
from collections.abc import Iterator

from .ask import AskSettings
from .chat import Conversation, Turn
from .context import Context
from .generate import Timings
from .output import write_stdout
from .prompt import user_message
from .remote import RemoteAnswer, Server

LOCAL_ONLY_SOURCES = "sources need the local engine (msa chat without --server)"


def ask_remote(server: Server, model: str, context: Context, question: str, settings: AskSettings, *,
               json_out: bool, started_at: float) -> None:
    """Stream the server's answer to stdout, or print one JSON object at the end."""
    answer, pieces = server.stream_chat(_first_messages(settings, context, question), model=model,
                                        **_sampling(settings))
    for piece in pieces:
        if not json_out:
            write_stdout(piece)
    if json_out:
        print(json.dumps(answer.as_json(server=server.url, started_at=started_at), ensure_ascii=False))
    else:
        write_stdout("\n")


class RemoteChatSession(Conversation):
    """A chat whose turns a server answers: the whole conversation is sent each turn, the
    documents first, so the server's prefix cache holds everything but the newest question."""

    def __init__(self, server: Server, model: str, context: Context, settings: AskSettings):
        super().__init__(context)
        self.server, self.model, self.settings = server, model, settings
        self.messages: list[dict] = []
        self.last: RemoteAnswer | None = None

    def reset(self) -> None:
        self.messages.clear()
        self.turns.clear()

    def ask(self, question: str) -> Iterator[str]:
        if self.messages:
            messages = self.messages + [{"role": "user", "content": question.strip()}]
        else:
            messages = _first_messages(self.settings, self.context, question)
        answer, pieces = self.server.stream_chat(messages, model=self.model, **_sampling(self.settings))
        turn = Turn(question, "", [], Timings(), stopped=True)
        try:
            for piece in pieces:
                turn.answer += piece
                yield piece
            turn.stopped = False
        finally:
            if turn.answer or not turn.stopped:    # an answer that never began leaves no turn
                self.messages = messages + [{"role": "assistant", "content": turn.answer}]
                turn.timings = Timings(prefill_tokens=answer.prompt_tokens or 0,
                                       generated_tokens=answer.generated_tokens or 0)
                self.turns.append(turn)
                self.last = answer

    def sources_lines(self) -> str:
        return LOCAL_ONLY_SOURCES

    def stats(self) -> str:
        lines = [f"documents: {len(self.context.files):,} files, answered by {self.model} at {self.server.url}",
                 f"conversation: {len(self.turns)} turns"]
        a = self.last
        if a is not None and a.prompt_tokens is not None:
            cached = "" if a.cached_tokens is None else f" ({a.cached_tokens:,} from the server's prefix cache)"
            lines.append(f"last answer: {a.prompt_tokens:,} prompt tokens{cached}, {a.generated_tokens or 0:,} written")
        return "\n".join(lines)


def _first_messages(settings: AskSettings, context: Context, question: str) -> list[dict]:
    """The messages `msa ask` reads on the local engine (`prompt.build_prompt`)."""
    system = [{"role": "system", "content": settings.system}] if settings.system else []
    return system + [{"role": "user", "content": user_message(context.text, question)}]


def _sampling(settings: AskSettings) -> dict:
    return {"max_tokens": settings.max_tokens, "temperature": settings.temperature, "top_p": settings.top_p,
            "seed": settings.seed}
