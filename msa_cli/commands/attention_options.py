"""The options that shape attention and the K/V cache, shared by the commands that read
documents, and the settings they make (usage errors, exit 2)."""

from __future__ import annotations

import typer

from ..engine.limits import MAX_BLOCK_SIZE
from .help_pages import ATTENTION
from .options import given_as

AttentionOption = typer.Option(
    "auto",
    "--attention",
    envvar="MSA_ATTENTION",
    show_envvar=True,
    help="auto: dense for the first 1,024 tokens, MSA block selection after; dense: every "
    "token reads every earlier one (up to the model's context); msa: block selection "
    "throughout.",
    rich_help_panel=ATTENTION,
)
TopkOption = typer.Option(
    None,
    "--topk",
    min=1,
    help="Blocks MSA selects per step besides the first and the most recent (the most, with "
    "--mass). [default: the model's, as `msa calibrate` measured it, else 24]",
    rich_help_panel=ATTENTION,
)
SelectionOption = typer.Option(
    "quest",
    "--selection",
    help="How a question and its answer choose blocks: quest (block bounds and the answer's "
    "rules) or index (each query's attention over the cache's 4-bit index, max-pooled per "
    "block; far blocks at their true distances within the model's trained context).",
    rich_help_panel=ATTENTION,
)
MassOption = typer.Option(
    None, "--mass", min=0.0, max=1.0, help="With --selection index: read the fewest blocks "
    "holding this share of the attention (a top-p budget), at most --topk.",
    rich_help_panel=ATTENTION,
)  # fmt: skip
BlockSizeOption = typer.Option(
    None,
    "--block-size",
    min=1,
    max=MAX_BLOCK_SIZE,
    help="Tokens per KV block. [default: the model's, 64]",
    rich_help_panel=ATTENTION,
)
LocalBlocksOption = typer.Option(
    1,
    "--local-blocks",
    min=1,
    help="Most recent blocks every token reads.",
    rich_help_panel=ATTENTION,
)
KvDtypeOption = typer.Option(
    "fp16",
    "--kv-dtype",
    envvar="MSA_KV_DTYPE",
    show_envvar=True,
    help="How keys and values are stored (memory, spill files, prefix cache): fp16 (as "
    "llama.cpp's cache; auto is fp16), bf16, fp32, or int8 (a quarter of fp32's disk).",
    rich_help_panel=ATTENTION,
)


def attention_settings(mode: str, topk: int | None, block_size, local_blocks: int, kv_dtype: str,
                       selection: str = "quest", mass: float | None = None):  # fmt: skip
    from msa.models.attention_settings import KV_DTYPE_ALIASES, KV_DTYPES, MODES, AttentionSettings

    if mode not in MODES:
        raise typer.BadParameter(
            f"{mode!r} is not one of {', '.join(MODES)}",
            param_hint=given_as("--attention", "MSA_ATTENTION", mode),
        )
    if kv_dtype not in KV_DTYPES and kv_dtype not in KV_DTYPE_ALIASES:
        raise typer.BadParameter(
            f"{kv_dtype!r} is not one of {', '.join(KV_DTYPES)}",
            param_hint=given_as("--kv-dtype", "MSA_KV_DTYPE", kv_dtype),
        )
    # the index scores keys at their true distances, so its blocks are read there too, up to
    # the trained context (None): moved next to the question, single needles the index had
    # found were lost (benchmarks/README.md, "Selection fidelity"); --topk is the index's, and
    # a document's chunks keep the model's
    index = {"bounded_from": None, "topk": None, "index_topk": topk} if selection == "index" else {}
    try:
        return AttentionSettings(**{"topk": topk, **index}, mode=mode, block_size=block_size,
                                 local_blocks=local_blocks, kv_dtype=kv_dtype,
                                 selection=selection, top_p=mass)  # fmt: skip
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--selection, --mass") from None
