"""`msa chat`: questions, one after another, about documents read once.

The documents are read into one KV cache when the chat starts (through the prefix cache, as
`msa ask` reads them, so an ask and a chat about the same file share it). Each turn appends
its question and answer to that cache, so turn N computes only its own tokens. `/reset`
truncates the cache back to the documents. The REPL and the /commands are in `repl`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import typer

from .attention_options import (
    AttentionOption,
    BlockSizeOption,
    KvDtypeOption,
    LocalBlocksOption,
    MassOption,
    SelectionOption,
    TopkOption,
    attention_settings,
)
from .errors import reports_errors
from .options import (
    ApiKeyOption,
    CacheDirOption,
    CacheRoOption,
    DtypeOption,
    HiddenOption,
    MaxTokensOption,
    ModelOption,
    NoCacheOption,
    QuantOption,
    QuietOption,
    SeedOption,
    ServerOption,
    SourcesOption,
    SystemOption,
    TemperatureOption,
    ThreadsOption,
    TimeoutOption,
    TopPOption,
    VerboseOption,
    check_precision,
    check_sources,
    check_top_p,
    check_verbosity,
)
from .repl import Conversation, Turn


@reports_errors
def chat(
    context: list[str] = typer.Option(
        ...,
        "--context",
        "-c",
        help="A text file or directory to talk about (repeatable; - reads stdin).",
    ),
    model: str = ModelOption,
    max_tokens: int = MaxTokensOption,
    temperature: float = TemperatureOption,
    top_p: float = TopPOption,
    seed: int | None = SeedOption,
    system: str | None = SystemOption,
    threads: int | None = ThreadsOption,
    quiet: bool = QuietOption,
    verbose: bool = VerboseOption,
    cache_dir: str | None = CacheDirOption,
    no_cache: bool = NoCacheOption,
    cache_ro: bool = CacheRoOption,
    attention: str = AttentionOption,
    topk: int = TopkOption,
    selection: str = SelectionOption,
    mass: float | None = MassOption,
    block_size: int | None = BlockSizeOption,
    local_blocks: int = LocalBlocksOption,
    kv_dtype: str = KvDtypeOption,
    sources: bool = SourcesOption,
    hidden: bool = HiddenOption,
    server: str | None = ServerOption,
    api_key: str | None = ApiKeyOption,
    timeout: float = TimeoutOption,
    quant: str | None = QuantOption,
    dtype: str = DtypeOption,
):
    """Talk about documents: read them once, then answer question after question.

    On a terminal: a prompt with history; /help lists the commands (/reset, /context, /sources,
    /stats, /save FILE, /exit); Ctrl-C stops an answer, Ctrl-D leaves. With stdin not a terminal,
    one question per line, each answer on stdout.

    The documents' K/V go to the prefix cache (budget: MSA_CACHE_MAX, default 10G), shared with
    msa ask.
    """
    from ..engine.documents import read_context
    from ..engine.paths import data_dir
    from .output import quiet_or_note
    from .repl import run_repl, run_scripted

    check_verbosity(quiet, verbose)
    check_top_p(top_p)
    attention_ = attention_settings(
        attention, topk, block_size, local_blocks, kv_dtype, selection, mass
    )
    check_precision(quant, dtype)
    check_sources(sources, server)
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if "-" in context and not interactive:
        raise typer.BadParameter(
            "stdin carries the questions; - cannot be a --context here", param_hint="--context"
        )
    documents = read_context(context, hidden=hidden, warn=quiet_or_note(quiet))
    if server:  # before the local engine's imports: a client does not load PyTorch
        from .remote_session import RemoteChatSession, Sampling, connect

        remote, served_model = connect(server, api_key, timeout, model)
        session = RemoteChatSession(
            remote, served_model, documents, Sampling(max_tokens, temperature, top_p, seed, system)
        )
    else:
        from .local import local_model

        loaded = local_model(model, cache_dir, threads, quant, dtype, verbose, attention_)
        engine_session = loaded.session(
            documents,
            attention=attention_,
            prefix_cache=not no_cache,
            cache_read_only=cache_ro,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            system=system,
            sources=True,
            note=quiet_or_note(quiet),
        )
        session = LocalChat(
            engine_session,
            progress=not quiet,
            summary=not quiet,
            verbose=verbose,
            show_sources=sources,
        )
        session.read_documents()
    if interactive:
        run_repl(session, data_dir() / "chat_history")
    else:
        run_scripted(session, sys.stdin)


class LocalChat(Conversation):
    """A chat the local engine answers: the REPL's side of an engine `Session`."""

    def __init__(
        self,
        session,
        *,
        progress: bool = False,
        summary: bool = False,
        verbose: bool = False,
        show_sources: bool = False,
    ):
        super().__init__(session.documents)
        self.session = session
        self.progress, self.summary, self.verbose = progress, summary, verbose
        self.show_sources = show_sources

    def read_documents(self) -> None:
        """Restore what the prefix cache holds of the documents and prefill the rest."""
        from .output import drawn, note, reading_summary

        def on_reading(reading) -> None:
            if self.summary:
                note(reading_summary(reading))

        for _ in drawn(self.session.read(), progress=self.progress, on_reading=on_reading):
            pass

    def reset(self) -> None:
        self.session.reset()
        self.turns.clear()

    def ask(self, question: str) -> Iterator[str]:
        """Stream the answer; the turn is recorded when the iterator ends or is cut short."""
        before = self.session.usage
        turn = Turn(question, "", None, None, stopped=True)
        events = self.session.ask(question)
        try:
            for event in events:
                if event.kind == "text":
                    turn.answer += event.text
                    yield event.text
                elif event.kind == "sources":
                    turn.sources = event.sources
                elif event.kind == "done":
                    turn.stopped = False
        finally:
            events.close()
            if self.session.usage is not before:  # the turn began (was not refused)
                turn.timings = self.session.usage
                if turn.sources is None:  # stopped before the engine listed them
                    turn.sources = self.session.sources()
                self.turns.append(turn)

    def after_answer(self) -> None:
        """--sources: the passages the last answer read, on stdout, as `msa ask` lists them;
        --verbose: its figures on stderr."""
        if self.show_sources and self.turns:
            from .output import sources_block, write_stdout

            write_stdout(sources_block(self.turns[-1].sources))
        if self.verbose and self.turns:
            from .output import answer_figures, note

            figures = answer_figures(self.turns[-1].timings, prompt=False)
            note(f"{figures}; the conversation is {len(self.session.seq):,} tokens")

    def stats(self) -> str:
        s = self.session
        lines = [
            f"documents: {len(self.context.files):,} files, {len(s.prompt.document):,} tokens "
            f"({s.cached_tokens:,} from the prefix cache)",
            f"conversation: {len(self.turns)} turns, {len(s.seq) - s.context_length:,} tokens; "
            f"KV cache: {s.cache.length:,} tokens",
        ]
        if self.turns:
            t = self.turns[-1].timings
            lines.append(
                f"last answer: {t.prefill_tokens:,} tokens read at {t.prefill_tok_s:,.1f} tok/s, "
                f"{t.generated_tokens:,} written at {t.decode_tok_s:,.1f} tok/s"
            )
        return "\n".join(lines)
