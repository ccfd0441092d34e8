"""The `msa` command line. Thin commands over the library; heavy imports inside commands."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from . import __version__
from .cache_commands import cache_app
from .errors import EXIT_CODES_HELP, reports_errors

app = typer.Typer(
    name="msa",
    help="Ask questions about very long documents, on your own machine.\n\n" + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
bench_app = typer.Typer(help="Measure speed.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(cache_app, name="cache")

DEFAULT_MODEL = "smollm2-135m"  # kept in step with msa_models.registry (not imported: --help stays instant)

ModelOption = typer.Option(DEFAULT_MODEL, "--model", "-m", envvar="MSA_MODEL", show_envvar=True,
                           help="A model name (see README), a .gguf file or a model directory.")
ThreadsOption = typer.Option(None, "--threads", "-t", envvar="MSA_THREADS", show_envvar=True, min=1,
                             help="CPU threads. [default: all cores]")
CacheDirOption = typer.Option(None, "--cache-dir", envvar="MSA_CACHE_DIR", show_envvar=True,
                              help="Where msa keeps converted models and caches. [default: $XDG_CACHE_HOME/msa]")


def _version(value: bool):
    if value:
        print(f"msa {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                        help="Print the version and exit.")):
    pass


@app.command(epilog=EXIT_CODES_HELP)
@reports_errors
def ask(
    path: str = typer.Argument(..., help="A text file, or - to read the document from stdin."),
    question: str = typer.Argument(..., help="The question about the document."),
    model: str = ModelOption,
    max_tokens: int = typer.Option(256, "--max-tokens", "-n", min=1, help="Stop the answer after this many tokens."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 picks the most likely token (greedy)."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling mass (with temperature > 0)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for sampling, for reproducible answers."),
    system: Optional[str] = typer.Option(None, "--system", help="A system prompt in place of the model's default."),
    threads: Optional[int] = ThreadsOption,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object with the answer and figures, at the end."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress or notes on stderr."),
    cache_dir: Optional[str] = CacheDirOption,
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the prefix cache."),
    cache_ro: bool = typer.Option(False, "--cache-ro", help="Read the prefix cache, write nothing to it."),
):
    """Answer a question about a document, streaming the answer to stdout.

    The K/V of the document is kept in the prefix cache (budget: MSA_CACHE_MAX, default 10G), so
    the next question about the same document reads only the question.
    """
    from .ask import AskSettings, process_start_time, stream_answer
    from .documents import read_document
    from .output import write_stdout
    from .paths import cache_dir as resolve_cache_dir
    from .prefix_cache import CacheOptions, budget_from_env, prefix_dir
    from .runtime import load, set_threads

    started_at = process_start_time()
    if top_p == 0:
        raise typer.BadParameter("must be > 0", param_hint="--top-p")
    prefix_cache = None if no_cache else CacheOptions(prefix_dir(resolve_cache_dir(cache_dir)),
                                                      max_bytes=budget_from_env(), read_only=cache_ro)
    document = read_document(path)
    set_threads(threads)
    loaded, load_s = load(model, cache=cache_dir)
    settings = AskSettings(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                           system=system, show_progress=not (quiet or json_out),
                           show_notes=not (quiet or json_out), prefix_cache=prefix_cache)
    answer, pieces = stream_answer(loaded, document, question, settings)
    for piece in pieces:
        if not json_out:
            write_stdout(piece)
    if json_out:
        print(json.dumps(answer.as_json(load_s=load_s, started_at=started_at), ensure_ascii=False))
    else:
        write_stdout("\n")


@bench_app.command("e2e")
@reports_errors
def bench_e2e(
    length: str = typer.Option("512,2k,8k", "--length", "-l", help="Context lengths, comma-separated; k and m suffixes."),
    model: str = ModelOption,
    decode_tokens: int = typer.Option(32, "--decode-tokens", min=1, help="Tokens decoded after each prefill."),
    threads: Optional[int] = ThreadsOption,
    json_out: bool = typer.Option(False, "--json", help="Print a JSON array, one object per length."),
    cache_dir: Optional[str] = CacheDirOption,
):
    """Prefill and decode speed of a model at each context length."""
    from .bench import parse_lengths, print_table, run_e2e
    from .runtime import load, set_threads

    lengths = parse_lengths(length)
    n_threads = set_threads(threads)
    loaded, _ = load(model, cache=cache_dir)
    rows = run_e2e(loaded, lengths, decode_tokens=decode_tokens)
    if json_out:
        print(json.dumps(rows))
    else:
        print_table(rows, title=f"msa bench e2e: {loaded.name}, {n_threads} threads")


def main() -> None:
    app(prog_name="msa")


if __name__ == "__main__":
    main()
