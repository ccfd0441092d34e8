"""`msa ask`: one document (or several files joined), one question, one streamed answer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

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
from .help_pages import OUTPUT
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

LONG_READ_TOKENS = 4096  # a single document this long (to read) gets the summary line too


@reports_errors
def ask(
    args: list[str] = typer.Argument(
        ...,
        metavar="PATH... QUESTION",
        help="Text files or directories (- reads stdin), then the question.",
    ),
    model: str = ModelOption,
    max_tokens: int = MaxTokensOption,
    temperature: float = TemperatureOption,
    top_p: float = TopPOption,
    seed: int | None = SeedOption,
    system: str | None = SystemOption,
    threads: int | None = ThreadsOption,
    json_out: bool = typer.Option(
        False,
        "--json",
        help="Print one JSON object with the answer and figures, at the end.",
        rich_help_panel=OUTPUT,
    ),
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
    """Answer a question about a document, streaming the answer to stdout.

    Several files, or a directory (walked with .gitignore honoured), are read as one document,
    each file under a header line with its path.

    The K/V of the document is kept in the prefix cache (budget: MSA_CACHE_MAX, default 10G), so
    the next question about the same document reads only the question.
    """
    from ..engine.documents import read_context
    from .output import quiet_or_note

    started_at = process_start()  # time to first token counts from the start
    check_verbosity(quiet, verbose)
    if len(args) < 2:
        raise typer.BadParameter(
            "give at least one PATH and a QUESTION", param_hint="PATH... QUESTION"
        )
    paths, question = args[:-1], args[-1]
    if not question.strip():  # the model would answer a question of its own invention
        raise typer.BadParameter("the question is empty", param_hint="QUESTION")
    check_top_p(top_p)
    attention_ = attention_settings(
        attention, topk, block_size, local_blocks, kv_dtype, selection, mass
    )
    check_precision(quant, dtype)
    check_sources(sources, server)
    document = read_context(paths, hidden=hidden, warn=quiet_or_note(quiet))
    if server:  # before the local engine's imports: a client does not load PyTorch
        from .remote_session import Sampling, ask_remote, connect

        remote, served_model = connect(server, api_key, timeout, model)
        ask_remote(
            remote,
            served_model,
            document,
            question,
            Sampling(max_tokens, temperature, top_p, seed, system),
            json_out=json_out,
            started_at=started_at,
        )
        return
    from .local import local_model

    loaded = local_model(model, cache_dir, threads, quant, dtype, verbose, attention_)
    session = loaded.session(
        document,
        attention=attention_,
        prefix_cache=not no_cache,
        cache_read_only=cache_ro,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        system=system,
        sources=sources,
        note=quiet_or_note(quiet or json_out),
    )
    _answer(session, question, loaded.load_s, started_at, json_out, quiet, verbose)


def process_start(proc: str = "/proc") -> float:
    """When this process started, in `time.time()` seconds. psutil's `create_time` adds the
    process's start in ticks since boot to the boot time that /proc/stat gives in whole seconds,
    so it runs up to a second early (0.68 s on the machine of benchmarks/README.md's "The second
    question at once"): the process's age on the boot clock, from /proc/uptime and its start
    in /proc/self/stat, is exact to a tick. psutil's where /proc cannot tell (not Linux)."""
    try:
        uptime = float(Path(proc, "uptime").read_text().split()[0])
        # the fields after the command's closing parenthesis: starttime is the 20th of them
        fields = Path(proc, "self", "stat").read_text().rsplit(")", 1)[1].split()
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        import psutil

        return psutil.Process().create_time()
    return time.time() - max(age, 0.0)


def _answer(session, question, load_s, started_at, json_out, quiet, verbose) -> None:
    from .output import answer_figures, drawn, note, reading_summary, sources_block, write_stdout

    def summary(reading) -> None:
        long = reading.joined or reading.prefill_tokens >= LONG_READ_TOKENS
        if not (quiet or json_out) and long:
            note(reading_summary(reading))

    text, found, usage = "", None, None
    for event in drawn(session.ask(question), progress=not (quiet or json_out), on_reading=summary):
        if event.kind == "text":
            text += event.text
            if not json_out:
                write_stdout(event.text)
        elif event.kind == "sources":
            found = event.sources
        elif event.kind == "done":
            usage = event.usage
    if verbose:
        note(answer_figures(usage))
    if json_out:
        extra = {} if found is None else {"sources": [s.as_json() for s in found]}
        print(
            json.dumps(
                {
                    "answer": text,
                    "model": session.loaded.name,
                    "prompt_tokens": usage.prompt_tokens,
                    "cached_tokens": usage.cached_tokens,
                    "prefill_tokens": usage.prefill_tokens,
                    "generated_tokens": usage.generated_tokens,
                    "finish_reason": usage.finish_reason,
                    "load_s": round(load_s, 4),
                    "ttft_s": round((usage.first_token_at or time.time()) - started_at, 4),
                    "prefill_tok_s": round(usage.prefill_tok_s, 2),
                    "decode_tok_s": round(usage.decode_tok_s, 2),
                    **extra,
                },
                ensure_ascii=False,
            )
        )
    else:
        write_stdout("\n")
        if found is not None:
            write_stdout(sources_block(found))
