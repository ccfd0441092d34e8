"""`msa cache`: list, inspect and trim the prefix cache (K/V blocks of documents already read)."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime

import typer

from .errors import reports_errors
from .visible import visible

cache_app = typer.Typer(
    help="The prefix cache: K/V blocks of the documents already read.", no_args_is_help=True
)

CacheDirOption = typer.Option(
    None,
    "--cache-dir",
    envvar="MSA_CACHE_DIR",
    show_envvar=True,
    help="msa's cache directory; the prefix cache is its prefix/ folder. "
    "[default: $XDG_CACHE_HOME/msa]",
)


def _index(cache_dir: str | None):
    from ..engine.paths import cache_dir as resolve_cache_dir
    from ..engine.prefix_cache import BlockStore, ChainIndex, prefix_dir

    return ChainIndex(BlockStore(prefix_dir(resolve_cache_dir(cache_dir))))


@contextlib.contextmanager
def _changing(index):
    """The store's lock, held to change the cache; a cache that cannot be changed (read-only,
    not ours, a full disk) ends the command with one line."""
    from msa.models.errors import disk_error

    try:
        with index.store.lock():
            yield
    except OSError as e:
        raise disk_error(e, f"cannot change the prefix cache {index.store.root}") from None


def _valid_chains(index) -> list:
    """The chains of valid manifests, with one warning line per file that is not one."""
    from .output import note

    def warn(path) -> None:
        note(
            f"warning: skipping {path} (not a valid manifest: damaged, or written by another "
            "msa version; `msa cache prune` removes it)"
        )

    try:
        return index.all(on_invalid=warn)
    except OSError as e:
        from msa.models.errors import disk_error

        raise disk_error(e, f"cannot read the prefix cache {index.store.root}") from None


# `cache ls`: the fewest columns a model or a source is cut to on a narrow terminal
NARROWEST = 10


def _time(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


@cache_app.command("ls")
@reports_errors
def ls(
    json_out: bool = typer.Option(
        False, "--json", help="Print a JSON array, one object per document."
    ),
    cache_dir: str | None = CacheDirOption,
):
    """One line per cached document: id, source, tokens, size, last used (most recent first)."""
    index = _index(cache_dir)
    rows = []
    for chain in sorted(_valid_chains(index), key=lambda c: c.last_used, reverse=True):
        rows.append(
            {
                "id": chain.id,
                "source": chain.source,
                "model": chain.model,
                "tokens": chain.tokens,
                "cached_tokens": index.cached_tokens(chain),
                "blocks": len(chain.blocks),
                "bytes": index.chain_bytes(chain),
                "created": _time(chain.created),
                "last_used": _time(chain.last_used),
            }
        )
    if json_out:
        print(json.dumps(rows, ensure_ascii=False))
        return
    if not rows:
        print(f"no cached documents in {index.store.root}")
        return
    _print_table(rows)


def _print_table(rows: list[dict]) -> None:
    """`cache ls` for people, as wide as the terminal (`terminal_width`, no limit in a pipe):
    the model and the source share what the other columns leave, each cut at its start to an
    ellipsis rather than wrapped (a file's name and a model's size and quant stay). The model
    and the token count tell apart two entries of one source."""
    from ..engine.prefix_cache import format_size
    from .output import terminal_width

    table = [["ID", "TOKENS", "SIZE", "LAST USED", "MODEL", "SOURCE"]]
    for r in rows:
        tokens = (
            f"{r['tokens']:,}"
            if r["cached_tokens"] == r["tokens"]
            else f"{r['cached_tokens']:,}/{r['tokens']:,}"
        )
        used = datetime.fromisoformat(r["last_used"]).strftime("%m-%d %H:%M")
        table.append([r["id"], tokens, format_size(r["bytes"]), used])
        table[-1] += [visible(r["model"]), visible(r["source"])]
    widths = [max(len(row[i]) for row in table) for i in range(6)]
    room = terminal_width() - sum(widths[:4]) - 2 * 5
    widths[4] = min(widths[4], max(room // 2, NARROWEST))
    widths[5] = min(widths[5], max(room - widths[4], NARROWEST))
    for row in table:
        cells = [_cut_start(cell, w) for cell, w in zip(row, widths)]
        cells = [
            c.rjust(w) if i in (1, 2) else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ]
        print("  ".join(cells).rstrip())


def _cut_start(text: str, width: int) -> str:
    """`text` in at most `width` columns: its end, after an ellipsis, where it is longer."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


@cache_app.command("info")
@reports_errors
def info(cache_dir: str | None = CacheDirOption):
    """Where the prefix cache is, its budget and what it holds."""
    from ..engine.prefix_cache import BUDGET_ENV, FORMAT_VERSION, budget_from_env, format_size

    budget = budget_from_env()  # a bad MSA_CACHE_MAX ends it before any line is printed
    index = _index(cache_dir)
    chains = _valid_chains(index)
    uses = index.counts()
    blocks = [key for key, _, _ in index.store.files() if key is not None]
    print(f"directory  {index.store.root}")
    print(f"format     {FORMAT_VERSION}")
    print(f"budget     {format_size(budget)} ({BUDGET_ENV})")
    print(f"size       {format_size(index.disk_bytes())}")
    print(f"documents  {len(chains)}")
    print(
        f"blocks     {len(blocks)} ({sum(1 for key in blocks if uses[key] > 1)} shared by several "
        "documents)"
    )


@cache_app.command("rm")
@reports_errors
def rm(
    chain_id: str = typer.Argument(
        ..., metavar="ID", help="A document's id from `msa cache ls` (a unique prefix will do)."
    ),
    cache_dir: str | None = CacheDirOption,
):
    """Remove one document; blocks it shares with other documents stay."""
    from ..engine.prefix_cache import format_size

    index = _index(cache_dir)
    with _changing(index):
        chain = index.find(chain_id)
        freed = index.remove(chain, others=index.all())
    print(f"removed {chain.id} ({visible(chain.source)}), freed {format_size(freed)}")


@cache_app.command("prune")
@reports_errors
def prune(
    max_size: str | None = typer.Option(
        None,
        "--max-size",
        help="Keep at most this much, e.g. 500M or 10G. [default: MSA_CACHE_MAX, else 10G]",
    ),
    cache_dir: str | None = CacheDirOption,
):
    """Remove the least recently used documents until the cache fits SIZE."""
    from ..engine.prefix_cache import budget_from_env, format_size, parse_size

    budget = parse_size(max_size, what="--max-size") if max_size is not None else budget_from_env()
    index = _index(cache_dir)
    with _changing(index):
        before, n_before = index.disk_bytes(), len(index.all())
        index.sweep()  # invalid manifests and blocks no document uses, whatever the budget
        index.evict(budget)
        after, n_after = index.disk_bytes(), len(index.all())
    removed = n_before - n_after
    print(
        f"removed {removed} document{'' if removed == 1 else 's'}, "
        f"freed {format_size(before - after)}; "
        f"the cache holds {format_size(after)} (budget {format_size(budget)})"
    )


@cache_app.command("clear")
@reports_errors
def clear(cache_dir: str | None = CacheDirOption):
    """Remove every cached document (converted models stay)."""
    import shutil

    from ..engine.prefix_cache import format_size

    index = _index(cache_dir)
    with _changing(index):
        freed = index.disk_bytes()
        for folder in (index.store.blocks_dir, index.dir, index.store.root / "tokens"):
            shutil.rmtree(folder, ignore_errors=True)
    print(f"cleared {index.store.root}, freed {format_size(freed)}")
