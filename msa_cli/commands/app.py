"""The `msa` command line. Thin commands over the library; heavy imports inside commands."""

from __future__ import annotations

import json
import sys

import typer

from msa.models.attention_settings import AttentionSettings  # a plain dataclass: no torch import

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
eval_app = typer.Typer(help="Measure answer quality.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")
app.add_typer(cache_app, name="cache")

DEFAULT_MODEL = (
    "smollm2-135m"  # kept in step with msa.models.registry (not imported: --help stays instant)
)

ModelOption = typer.Option(
    DEFAULT_MODEL,
    "--model",
    "-m",
    envvar="MSA_MODEL",
    show_envvar=True,
    help="A model name (see README), a .gguf file or a model directory.",
)
ThreadsOption = typer.Option(
    None,
    "--threads",
    "-t",
    envvar="MSA_THREADS",
    show_envvar=True,
    min=1,
    help="CPU threads. [default: all cores]",
)
CacheDirOption = typer.Option(
    None,
    "--cache-dir",
    envvar="MSA_CACHE_DIR",
    show_envvar=True,
    help="Where msa keeps converted models and caches. [default: $XDG_CACHE_HOME/msa]",
)


MaxTokensOption = typer.Option(
    256, "--max-tokens", "-n", min=1, help="Stop an answer after this many tokens."
)
TemperatureOption = typer.Option(
    0.0, "--temperature", min=0.0, help="0 picks the most likely token (greedy)."
)
TopPOption = typer.Option(
    1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling mass (with temperature > 0)."
)
SeedOption = typer.Option(None, "--seed", help="Seed for sampling, for reproducible answers.")
SystemOption = typer.Option(
    None, "--system", help="A system prompt in place of the model's default."
)
NoCacheOption = typer.Option(False, "--no-cache", help="Neither read nor write the prefix cache.")
CacheRoOption = typer.Option(
    False, "--cache-ro", help="Read the prefix cache, write nothing to it."
)
AttentionOption = typer.Option(
    "auto",
    "--attention",
    envvar="MSA_ATTENTION",
    show_envvar=True,
    help="auto: dense for the first 1,024 tokens, MSA block selection after (no length limit); "
    "dense: every token reads every earlier one (up to the model's context); msa: block selection throughout.",
)
TopkOption = typer.Option(
    AttentionSettings.topk,
    "--topk",
    min=1,
    help="Blocks of the KV cache MSA selects per step, besides the first and the most recent.",
)
BlockSizeOption = typer.Option(
    None, "--block-size", min=1, help="Tokens per KV block. [default: the model's, 64]"
)
LocalBlocksOption = typer.Option(
    1, "--local-blocks", min=1, help="Most recent blocks every token reads."
)
KvDtypeOption = typer.Option(
    "auto",
    "--kv-dtype",
    envvar="MSA_KV_DTYPE",
    show_envvar=True,
    help="auto: keys and values in the compute dtype; int8: rounded to int8 (one scale per token and head), "
    "so the prefix cache takes about a quarter of the disk.",
)
QuietOption = typer.Option(
    False,
    "--quiet",
    "-q",
    envvar="MSA_QUIET",
    show_envvar=True,
    help="Nothing on stderr but errors: no progress, notes or warnings.",
)
VerboseOption = typer.Option(
    False,
    "--verbose",
    "-v",
    envvar="MSA_VERBOSE",
    show_envvar=True,
    help="More on stderr: the model and settings used, and each answer's figures.",
)
QuantOption = typer.Option(
    None,
    "--quant",
    envvar="MSA_QUANT",
    show_envvar=True,
    help="The weights' precision: int8 (per channel) or int4 (groups of 32), quantized on "
    "load, or none (floating point). [default: as the file stores them: int4 for a GGUF "
    "of Q4_1 weights such as the embedded model, else floating point]",
)
DtypeOption = typer.Option(
    "fp32",
    "--dtype",
    envvar="MSA_DTYPE",
    show_envvar=True,
    help="Compute dtype: fp32, or bf16 (fast only on CPUs with bf16 units).",
)
HiddenOption = typer.Option(
    False, "--hidden", help="Also read hidden files and folders of directories (.git never)."
)
ServerOption = typer.Option(
    None,
    "--server",
    envvar="MSA_SERVER",
    show_envvar=True,
    help="An OpenAI-compatible server (vLLM, SGLang, llama.cpp, msa serve) to answer in place of the local "
    "engine, e.g. http://gpu-box:8000/v1. --attention, --topk, --block-size, --local-blocks, --threads "
    "and the cache options are then the server's business.",
)
ApiKeyOption = typer.Option(
    None,
    "--api-key",
    envvar="MSA_API_KEY",
    show_envvar=True,
    help="The key the --server asks for (sent as 'Authorization: Bearer KEY').",
)
TimeoutOption = typer.Option(
    600.0,
    "--timeout",
    min=0.001,
    help="Seconds to wait for the --server to connect or to send its next bytes.",
)


def _attention_settings(mode: str, topk: int, block_size, local_blocks: int, kv_dtype: str):
    from msa.models.attention_settings import KV_DTYPES, MODES, AttentionSettings

    if mode not in MODES:
        raise typer.BadParameter(
            f"{mode!r} is not one of {', '.join(MODES)}", param_hint="--attention"
        )
    if kv_dtype not in KV_DTYPES:
        raise typer.BadParameter(
            f"{kv_dtype!r} is not one of {', '.join(KV_DTYPES)}", param_hint="--kv-dtype"
        )
    return AttentionSettings(
        mode=mode, topk=topk, block_size=block_size, local_blocks=local_blocks, kv_dtype=kv_dtype
    )


def _check_precision(quant, dtype: str = "fp32") -> None:
    # the lists of msa.models.quantize.MODES + loading.FLOAT and loading.DTYPES, written out:
    # importing them would import PyTorch, which a --server client never needs
    if quant is not None and quant not in ("int8", "int4", "none"):
        raise typer.BadParameter(f"{quant!r} is not one of int8, int4, none", param_hint="--quant")
    if dtype not in ("fp32", "bf16"):
        raise typer.BadParameter(f"{dtype!r} is not one of fp32, bf16", param_hint="--dtype")


def _print_rows(rows: list[dict], json_out: bool, title: str) -> None:
    """A JSON array on stdout, or a table for people."""
    if json_out:
        print(json.dumps(rows))
    else:
        from .bench import print_table

        print_table(rows, title=title)


def _version(value: bool):
    if value:
        print(f"msa {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
):
    pass


@app.command(epilog=EXIT_CODES_HELP)
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
        False, "--json", help="Print one JSON object with the answer and figures, at the end."
    ),
    quiet: bool = QuietOption,
    verbose: bool = VerboseOption,
    cache_dir: str | None = CacheDirOption,
    no_cache: bool = NoCacheOption,
    cache_ro: bool = CacheRoOption,
    attention: str = AttentionOption,
    topk: int = TopkOption,
    block_size: int | None = BlockSizeOption,
    local_blocks: int = LocalBlocksOption,
    kv_dtype: str = KvDtypeOption,
    sources: bool = typer.Option(
        False,
        "--sources",
        help="After the answer, list the passages the model read (file, lines, score).",
    ),
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
    from .context import read_context
    from .output import write_stdout
    from .runtime import process_start_time

    started_at = process_start_time()
    _check_verbosity(quiet, verbose)
    if len(args) < 2:
        raise typer.BadParameter(
            "give at least one PATH and a QUESTION", param_hint="PATH... QUESTION"
        )
    paths, question = args[:-1], args[-1]
    if top_p == 0:
        raise typer.BadParameter("must be > 0", param_hint="--top-p")
    attention_settings = _attention_settings(attention, topk, block_size, local_blocks, kv_dtype)
    _check_precision(quant, dtype)
    if server and sources:
        raise typer.BadParameter(
            "needs the local engine: leave out --server to list sources", param_hint="--sources"
        )
    document = read_context(paths, hidden=hidden, warn=_warn_unless(quiet))
    if server:  # before the local engine's imports: a client does not load PyTorch
        from .remote_commands import Sampling, ask_remote

        remote, served_model = _connect(server, api_key, timeout, model)
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
    from .ask import AskSettings, answer_figures, stream_answer
    from .paths import cache_dir as resolve_cache_dir

    loaded, load_s, prefix_cache = _local_engine(
        model,
        cache_dir,
        threads,
        quant,
        dtype,
        no_cache,
        cache_ro,
        verbose,
        attention_settings,
        quiet=quiet or json_out,
    )
    settings = AskSettings(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        system=system,
        show_progress=not (quiet or json_out),
        show_notes=not (quiet or json_out),
        prefix_cache=prefix_cache,
        attention=attention_settings,
        kv_spill_dir=resolve_cache_dir(cache_dir) / "kv",
        sources=sources,
        summary=not (quiet or json_out),
        speed_dir=resolve_cache_dir(cache_dir),
    )
    answer, pieces = stream_answer(loaded, document, question, settings)
    for piece in pieces:
        if not json_out:
            write_stdout(piece)
    if verbose:
        _note(
            answer_figures(
                answer.timings,
                prompt_tokens=answer.prompt_tokens,
                cached_tokens=answer.cached_tokens,
            )
        )
    if json_out:
        print(json.dumps(answer.as_json(load_s=load_s, started_at=started_at), ensure_ascii=False))
    else:
        write_stdout("\n")
        if sources:
            write_stdout("\nSources:\n" + "".join(f"  {s.line()}\n" for s in answer.sources or []))


def _local_engine(
    model,
    cache_dir,
    threads,
    quant,
    dtype,
    no_cache: bool,
    cache_ro: bool,
    verbose: bool,
    attention_settings,
    *,
    quiet: bool = False,
):
    """What ask and chat need to answer on this machine: the loaded model, its load time and the
    prefix cache's options (None with --no-cache)."""
    from .paths import cache_dir as resolve_cache_dir
    from .prefix_cache import CacheOptions, budget_from_env, prefix_dir
    from .runtime import load, set_threads

    prefix_cache = (
        None
        if no_cache
        else CacheOptions(
            prefix_dir(resolve_cache_dir(cache_dir)),
            max_bytes=budget_from_env(),
            read_only=cache_ro,
        )
    )
    n_threads = set_threads(threads)
    loaded, load_s = load(
        model, cache=cache_dir, quant=quant, dtype=dtype, note=None if quiet else _note
    )
    if verbose:
        _note(_model_line(loaded, load_s, n_threads, attention_settings))
    return loaded, load_s, prefix_cache


def _check_verbosity(quiet: bool, verbose: bool) -> None:
    if quiet and verbose:
        raise typer.BadParameter(
            "--quiet and --verbose contradict each other", param_hint="--verbose"
        )


def _note(message: str) -> None:
    from .runtime import stderr_note

    stderr_note(message)


def _model_line(loaded, load_s: float, n_threads: int, attention) -> str:
    """--verbose: which model, from where, and the settings that shape reading."""
    block = attention.block_size or "the model's"
    return (
        f"model {loaded.name} ({loaded.source}), {loaded.weights} weights, loaded in {load_s:.2f} s; "
        f"{n_threads} threads; "
        f"attention {attention.mode}, top-k {attention.topk}, block size {block}, "
        f"{attention.local_blocks} local block{'s' if attention.local_blocks != 1 else ''}"
        f"{'; int8 K/V' if attention.kv_dtype == 'int8' else ''}; decode "
        f"{'in one fused CPU step' if loaded.per_op_reason is None else f'op by op ({loaded.per_op_reason})'}"
    )


def _connect(server: str, api_key: str | None, timeout: float, model: str):
    """The --server, and the model to ask it for: --model when it serves it, else (when
    --model was left at its default) its only one."""
    from .remote import Server

    remote = Server(server, api_key=api_key, timeout=timeout)
    return remote, remote.model(model, chosen=model != DEFAULT_MODEL)


def _warn_unless(quiet: bool):
    """One line on stderr per skipped file, unless --quiet."""
    return (lambda message: None) if quiet else _note


@app.command(epilog=EXIT_CODES_HELP)
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
    block_size: int | None = BlockSizeOption,
    local_blocks: int = LocalBlocksOption,
    kv_dtype: str = KvDtypeOption,
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
    from .context import read_context
    from .conversation import run_repl, run_scripted
    from .paths import data_dir

    _check_verbosity(quiet, verbose)
    if top_p == 0:
        raise typer.BadParameter("must be > 0", param_hint="--top-p")
    attention_settings = _attention_settings(attention, topk, block_size, local_blocks, kv_dtype)
    _check_precision(quant, dtype)
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if "-" in context and not interactive:
        raise typer.BadParameter(
            "stdin carries the questions; - cannot be a --context here", param_hint="--context"
        )
    documents = read_context(context, hidden=hidden, warn=_warn_unless(quiet))
    if server:  # before the local engine's imports: a client does not load PyTorch
        from .remote_commands import RemoteChatSession, Sampling

        remote, served_model = _connect(server, api_key, timeout, model)
        session = RemoteChatSession(
            remote, served_model, documents, Sampling(max_tokens, temperature, top_p, seed, system)
        )
    else:
        from .ask import AskSettings
        from .chat import ChatSession
        from .paths import cache_dir as resolve_cache_dir

        loaded, _, prefix_cache = _local_engine(
            model,
            cache_dir,
            threads,
            quant,
            dtype,
            no_cache,
            cache_ro,
            verbose,
            attention_settings,
            quiet=quiet,
        )
        settings = AskSettings(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            system=system,
            show_progress=not quiet,
            show_notes=not quiet,
            prefix_cache=prefix_cache,
            attention=attention_settings,
            kv_spill_dir=resolve_cache_dir(cache_dir) / "kv",
            sources=True,
            summary=not quiet,
            verbose=verbose,
            speed_dir=resolve_cache_dir(cache_dir),
        )
        session = ChatSession(loaded, documents, settings)
        session.read_documents()
    if interactive:
        run_repl(session, data_dir() / "chat_history")
    else:
        run_scripted(session, sys.stdin)


models_app = typer.Typer(
    help="Known models, installed or not; `msa models rm NAME` deletes one's files.",
    invoke_without_command=True,
)
app.add_typer(models_app, name="models")


@models_app.callback()
@reports_errors
def models_command(
    ctx: typer.Context,
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per model."
    ),
):
    """Known models: installed or not, size on disk, context length, source."""
    if ctx.invoked_subcommand is not None:
        return
    from .models_list import model_rows, print_models

    rows = model_rows()
    if json_out:
        print(json.dumps(rows))
    else:
        print_models(rows)


@models_app.command("rm", epilog=EXIT_CODES_HELP)
@reports_errors
def models_rm(
    name: str = typer.Argument(
        ...,
        metavar="NAME",
        help="A pulled model (registry name or hub id owner/name), "
        "or a model whose GGUF file msa converted (name or .gguf path).",
    ),
    cache_dir: str | None = CacheDirOption,
):
    """Delete a pulled model's files, or the converted copy msa keeps of a GGUF model."""
    from .model_removal import remove_model
    from .paths import cache_dir as resolve_cache_dir
    from .paths import converted_models_dir
    from .prefix_cache import format_size

    for r in remove_model(name, converted_models_dir(resolve_cache_dir(cache_dir))):
        print(f"removed {name}: {r.what}, {format_size(r.size_bytes)}, {r.path}")


@app.command(epilog=EXIT_CODES_HELP)
@reports_errors
def pull(
    model: str = typer.Argument(
        ...,
        metavar="MODEL",
        help="A registry name (see `msa models`) or a Hugging Face repository id, owner/name.",
    ),
    quiet: bool = QuietOption,
):
    """Download a model from the Hugging Face hub (HF_ENDPOINT, default huggingface.co).

    Only safetensors weights, config and tokenizer files are fetched, into the hub cache (HF_HOME);
    an interrupted pull keeps the files it finished, and pulling again fetches the rest. Prints
    the model's folder; afterwards `--model MODEL` loads it.
    """
    from .pull import pull as pull_model

    folder = pull_model(model, quiet=quiet, note=_warn_unless(quiet))
    print(folder)


@app.command("quantize", epilog=EXIT_CODES_HELP)
@reports_errors
def quantize_command(
    model: str = typer.Argument(..., help="A model name, a .gguf file or a model directory."),
    to: str = typer.Option(
        ..., "--to", help="int8 (per output channel) or int4 (groups of 32, asymmetric)."
    ),
    cache_dir: str | None = CacheDirOption,
):
    """Write a quantized copy of MODEL, used as --model MODEL-int8 or MODEL-int4 and listed by msa models.

    The copy keeps the weights quantized on disk and in memory (the output head stays int8 in
    int4 mode); a GGUF's Q4_1 weights go into int4 unchanged.
    """
    from .paths import cache_dir as resolve_cache_dir
    from .paths import converted_models_dir, quantized_models_dir
    from .prefix_cache import format_size

    if to not in ("int8", "int4"):
        raise typer.BadParameter(f"{to!r} is not one of int8, int4", param_hint="--to")
    from msa.models.loading import write_quantized

    folder = write_quantized(
        model,
        to,
        quantized_root=quantized_models_dir(),
        converted_root=converted_models_dir(resolve_cache_dir(cache_dir)),
    )
    size = sum(f.stat().st_size for f in folder.iterdir())
    print(
        f"wrote {folder.name} ({format_size(size)}) to {folder}; use it with --model {folder.name}"
    )


@bench_app.command("e2e")
@reports_errors
def bench_e2e(
    length: str = typer.Option(
        "512,2k,8k", "--length", "-l", help="Context lengths, comma-separated; k and m suffixes."
    ),
    model: str = ModelOption,
    decode_tokens: int = typer.Option(
        32, "--decode-tokens", min=1, help="Tokens decoded after each prefill."
    ),
    threads: int | None = ThreadsOption,
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per length."
    ),
    cache_dir: str | None = CacheDirOption,
    attention: str = AttentionOption,
    topk: int = TopkOption,
    block_size: int | None = BlockSizeOption,
    local_blocks: int = LocalBlocksOption,
    kv_dtype: str = KvDtypeOption,
    quant: str | None = QuantOption,
    dtype: str = DtypeOption,
):
    """Prefill and decode speed of a model at each context length, and the process's peak memory.

    For each length: prefill that many random tokens (in chunks of 512), then decode
    --decode-tokens greedily. Tokens/s are wall-clock; peak_rss_mb is the process's peak
    resident memory so far (weights, KV cache and work buffers).
    """
    from .bench import parse_lengths, run_e2e
    from .runtime import load, set_threads

    lengths = parse_lengths(length)
    settings = _attention_settings(attention, topk, block_size, local_blocks, kv_dtype)
    _check_precision(quant, dtype)
    n_threads = set_threads(threads)
    loaded, load_s = load(model, cache=cache_dir, quant=quant, dtype=dtype)
    from .paths import cache_dir as resolve_cache_dir

    rows = run_e2e(
        loaded,
        lengths,
        decode_tokens=decode_tokens,
        settings=settings,
        spill_dir=resolve_cache_dir(cache_dir) / "kv",
    )
    for row in rows:
        row.update(model=loaded.name, weights=loaded.weights, threads=n_threads)
    _print_rows(
        rows,
        json_out,
        f"msa bench e2e: {loaded.name}, {loaded.weights} weights, "
        f"{attention} attention, {n_threads} threads",
    )


@bench_app.command("attention")
@reports_errors
def bench_attention(
    length: str = typer.Option(
        "8k,32k,128k,1m", "--length", "-l", help="Numbers of cached tokens; k and m suffixes."
    ),
    topk: int = TopkOption,
    block_size: int = typer.Option(64, "--block-size", min=1, help="Tokens per KV block."),
    local_blocks: int = typer.Option(
        1, "--local-blocks", min=1, help="Most recent blocks always attended."
    ),
    device: str = typer.Option("cpu", "--device", help="cpu, or cuda for the Triton kernels."),
    repeats: int = typer.Option(
        5, "--repeats", min=1, help="Timed runs per op; the median is reported."
    ),
    threads: int | None = ThreadsOption,
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per length."
    ),
):
    """One decode step of one layer's attention (the embedded model's shapes), dense against MSA."""
    from .bench import parse_lengths, run_attention
    from .runtime import set_threads

    lengths = parse_lengths(length)
    n_threads = set_threads(threads)
    rows = run_attention(
        lengths,
        n_heads=9,
        n_kv_heads=3,
        head_dim=64,
        block_size=block_size,
        topk=topk,
        local_blocks=local_blocks,
        sink_blocks=1,
        device=device,
        repeats=repeats,
    )
    _print_rows(
        rows,
        json_out,
        f"msa bench attention: 9 query heads, 3 KV heads, head_dim 64, {device}, {n_threads} threads",
    )


@eval_app.command("passkey")
@reports_errors
def eval_passkey(
    length: str = typer.Option(
        "1k,4k,16k", "--length", "-l", help="Document lengths in tokens; k and m suffixes."
    ),
    depths: int = typer.Option(
        5, "--depths", min=1, help="Depths at which the key is hidden, evenly spread."
    ),
    attention: str = typer.Option(
        "dense,msa",
        "--attention",
        help="Attention modes to compare (dense runs up to the model's context).",
    ),
    model: str = ModelOption,
    topk: int = TopkOption,
    threads: int | None = ThreadsOption,
    quant: str | None = QuantOption,
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per length and mode."
    ),
    cache_dir: str | None = CacheDirOption,
):
    """Pass-key retrieval accuracy by length and depth."""
    from msa.models.attention_settings import AttentionSettings

    from .bench import parse_lengths
    from .evals import run_passkey
    from .runtime import load, set_threads

    _check_precision(quant)
    lengths = parse_lengths(length)
    set_threads(threads)
    loaded, _ = load(model, cache=cache_dir, quant=quant)
    try:
        modes = [(m, AttentionSettings(mode=m, topk=topk)) for m in attention.split(",")]
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--attention") from None
    note = (
        None
        if json_out
        else (
            lambda n, label, r: print(
                f"  {n:>8,} {label:>5} depth {r['depth']:.2f}: "
                f"{'found' if r['found'] else 'missed'} ({r['answer']!r})",
                file=sys.stderr,
            )
        )
    )
    rows = run_passkey(
        loaded,
        lengths,
        depths,
        modes,
        dense_limit=loaded.config.max_position_embeddings,
        on_result=note,
    )
    if json_out:
        print(json.dumps(rows))
    else:
        summary = [
            {k: r[k] for k in ("length", "attention", "correct", "total", "accuracy", "seconds")}
            for r in rows
        ]
        _print_rows(summary, False, f"msa eval passkey: {loaded.name}, {loaded.weights} weights")


@app.command(epilog=EXIT_CODES_HELP)
@reports_errors
def serve(
    model: str = ModelOption,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="The address to listen on (0.0.0.0: every interface)."
    ),
    port: int = typer.Option(
        8000, "--port", "-p", min=0, max=65535, help="The port to listen on (0: any free one)."
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="MSA_API_KEY",
        show_envvar=True,
        help="Answer only requests that send 'Authorization: Bearer KEY'.",
    ),
    max_tokens: int = typer.Option(
        2048,
        "--max-tokens",
        "-n",
        min=1,
        help="The longest answer a request may ask for (more is a 400 error); "
        "also the length of answers whose request does not say.",
    ),
    max_request_bytes: int = typer.Option(
        64_000_000,
        "--max-request-bytes",
        min=1,
        help="The largest request body (more is a 400 error).",
    ),
    queue_size: int = typer.Option(
        16,
        "--queue-size",
        min=1,
        help="Requests that may wait while one is answered; past that, 503.",
    ),
    threads: int | None = ThreadsOption,
    quant: str | None = QuantOption,
    cache_dir: str | None = CacheDirOption,
    no_cache: bool = NoCacheOption,
    attention: str = AttentionOption,
    topk: int = TopkOption,
    block_size: int | None = BlockSizeOption,
    local_blocks: int = LocalBlocksOption,
    kv_dtype: str = KvDtypeOption,
):
    """Serve the model over HTTP with OpenAI's API: /v1/chat/completions (streaming or not),
    /v1/models, /health.

    One request is answered at a time, the rest wait in a queue. Documents share the prefix cache
    with `msa ask` and `msa chat`. Ctrl-C stops the server.
    """
    from .runtime import load, set_threads
    from .server.run import address, listen, make_app, serve_until_stopped

    _check_precision(quant)
    attention_settings = _attention_settings(attention, topk, block_size, local_blocks, kv_dtype)
    sock = listen(host, port)
    set_threads(threads)
    loaded, _ = load(model, cache=cache_dir, quant=quant)
    app_ = make_app(
        loaded,
        attention_settings,
        cache_dir=cache_dir,
        no_cache=no_cache,
        queue_size=queue_size,
        api_key=api_key,
        max_request_bytes=max_request_bytes,
        max_tokens=max_tokens,
    )
    print(
        f"msa serve: {loaded.name} ({loaded.weights} weights) at {address(sock)}/v1 (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    serve_until_stopped(app_, sock)


def main() -> None:
    app(prog_name="msa")


if __name__ == "__main__":
    main()
