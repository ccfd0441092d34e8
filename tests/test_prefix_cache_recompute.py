"""A corrupted block of the prefix cache is recomputed bit for bit: the K/V of the first fill,
under the default attention (MSA past its dense tokens), and the cold run's answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from msa.app import app
from msa.engine.generate import PREFILL_CHUNK
from msa.engine.prefix_cache import CacheOptions
from msa.engine.prompt import build_prompt
from msa.engine.reading import open_prefix_cache, prefill_prompt
from msa.engine.settings import Settings

pytestmark = pytest.mark.slow

QUESTION = "What did the keeper see in entry 97?"
SKIES = ["grey", "clear", "stormy", "red", "pale"]


def logbook(n_entries: int) -> str:
    return "".join(
        f"Entry {i}: the keeper counted {i * 7 % 23} ships under a {SKIES[i % 5]} sky.\n"
        for i in range(n_entries)
    )


def ask(*args) -> dict:
    result = CliRunner().invoke(app, ["ask", *map(str, args), "-n", "6", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def read_block(path: Path) -> dict[str, torch.Tensor]:
    """A block file's tensors, copied (safetensors may map the file, which a test then changes)."""
    return {name: tensor.clone() for name, tensor in load_file(path).items()}


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 2 // 3] ^= 0x01  # inside the tensors' bytes (the header is ~1 kB)
    path.write_bytes(bytes(data))


def test_a_corrupted_middle_block_is_recomputed_as_the_first_fill_computed_it(
    embedded, tmp_path, isolated_home
):
    path = tmp_path / "long.txt"
    path.write_text(logbook(160))
    root = isolated_home / ".cache" / "msa" / "prefix"
    settings = Settings(prefix_cache=CacheOptions(root))  # the default attention, as `msa ask`
    prompt = build_prompt(embedded.tokenizer, path.read_text(), QUESTION)
    assert 2800 < prompt.context_length < 3200
    assert prompt.context_length > settings.attention.sparse_from  # MSA reads part of it

    cold = ask(path, QUESTION, "--no-cache")
    first = ask(path, QUESTION)  # fills the cache
    assert (first["cached_tokens"], first["answer"]) == (0, cold["answer"])

    cache = embedded.model.new_cache(capacity=len(prompt.ids))
    stored = open_prefix_cache(embedded, cache, prompt, str(path), settings)
    fill = {bk.index: read_block(stored.store.path(bk.key)) for bk in stored.keys}
    per_chunk = PREFILL_CHUNK // cache.block_size
    bad = stored.keys[2 * per_chunk + 3]  # a middle block, not at a chunk's start
    bad_file = stored.store.path(bad.key)

    flip_one_byte(bad_file)
    result = CliRunner().invoke(app, ["ask", str(path), QUESTION, "-n", "6", "-v"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == cold["answer"].strip()  # the cold run's greedy tokens
    first_recomputed, last = 2 * per_chunk, stored.keys[-1].index
    assert (
        f"msa: cache: block {bad.index} of {path} is corrupted (checksum mismatch): dropped, "
        f"recomputing blocks {first_recomputed}-{last} from token "
        f"{first_recomputed * cache.block_size:,}"
    ) in result.stderr.splitlines()
    rewritten = read_block(bad_file)
    assert rewritten.keys() == fill[bad.index].keys()
    for name, tensor in fill[bad.index].items():
        assert torch.equal(rewritten[name], tensor), name

    # in this process, every recomputed block's K/V (and summaries) against the first fill's
    flip_one_byte(bad_file)
    cache = embedded.model.new_cache(capacity=len(prompt.ids))
    stored = open_prefix_cache(embedded, cache, prompt, str(path), settings)
    assert stored.restore(cache) == first_recomputed * cache.block_size
    prefill_prompt(embedded.model, cache, prompt, stored)
    for bk in stored.keys[first_recomputed:]:
        again = cache.export_block(bk.index)
        for name, tensor in fill[bk.index].items():
            if name in ("k", "v"):  # the last block's K/V, up to the context's end
                assert torch.equal(again[name][:, :, : bk.tokens], tensor), (bk.index, name)
            else:
                assert torch.equal(again[name], tensor), (bk.index, name)
