"""The prefix cache across real processes: a restart, two at once, and kill -9 mid-prefill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from processes import LIMIT_S, start_msa, wait_until
from typer.testing import CliRunner

from msa.app import app
from msa.engine.prefix_cache import BlockStore, CacheOptions, ChainIndex
from msa.engine.prompt import build_prompt
from msa.engine.reading import open_prefix_cache, prefill_prompt
from msa.engine.settings import Settings

pytestmark = pytest.mark.slow

QUESTION = "Which sky came with entry 7?"
SKIES = ["grey", "clear", "stormy", "red", "pale"]


def logbook(n_entries: int) -> str:
    return (
        "\n".join(
            f"Entry {i}: the keeper counted {i * 7 % 23} ships under a {SKIES[i % 5]} sky."
            for i in range(n_entries)
        )
        + "\n"
    )


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=2 * LIMIT_S)  # a whole answer
    assert proc.returncode == 0, err
    assert err == ""
    return json.loads(out)


def prefix_root(home: Path) -> Path:
    return home / ".cache" / "msa" / "prefix"


def test_two_processes_at_once_then_a_restart_give_the_same_answer_and_logits(
    embedded, tmp_path, isolated_home
):
    path = tmp_path / "log.txt"
    path.write_text(logbook(8))
    prompt = build_prompt(embedded.tokenizer, path.read_text(), QUESTION)
    assert prompt.context_length == 41 + 132

    both = [start_msa("ask", path, QUESTION, "-n", "4", "--json") for _ in range(2)]
    first, second = (finish(p) for p in both)
    assert first["answer"] == second["answer"]
    assert first["prompt_tokens"] == second["prompt_tokens"] == len(prompt.ids)

    # the cache is whole: one chain, every block readable and checked, no temporary file left
    root = prefix_root(isolated_home)
    index = ChainIndex(BlockStore(root))
    [chain] = index.all()
    cache = embedded.model.new_cache(capacity=len(prompt.ids))
    stored = open_prefix_cache(
        embedded,
        cache,
        prompt,
        str(path),
        Settings(prefix_cache=CacheOptions(root, read_only=True)),
    )
    assert chain.blocks == [bk.key for bk in stored.keys] and len(chain.blocks) == 3
    assert sorted(key for key, _, _ in index.store.files()) == sorted(chain.blocks)
    assert stored.restore(cache) == 173

    # a new process reads what the others wrote: only the question is computed, same answer
    restarted = finish(start_msa("ask", path, QUESTION, "-n", "4", "--json"))
    assert (restarted["cached_tokens"], restarted["prefill_tokens"]) == (173, len(prompt.tail))
    assert restarted["answer"] == first["answer"]
    # and the logits from their blocks equal those computed here without any cache, bit for bit
    warm = prefill_prompt(embedded.model, cache, prompt, None)
    fresh = embedded.model.new_cache(capacity=len(prompt.ids))
    assert torch.equal(warm, prefill_prompt(embedded.model, fresh, prompt, None))


def test_kill_9_during_a_long_prefill_then_the_next_ask_resumes(embedded, tmp_path, isolated_home):
    path = tmp_path / "long.txt"
    path.write_text(logbook(328))
    prompt = build_prompt(embedded.tokenizer, path.read_text(), QUESTION)
    assert prompt.context_length == 6020  # the dense model reads at most 8,192
    root = prefix_root(isolated_home)
    index = ChainIndex(BlockStore(root))

    proc = start_msa("ask", path, QUESTION, "-n", "1", "--json")
    wait_until(
        lambda: sum(1 for key, _, _ in index.store.files() if key) >= 40,
        "5 chunks of 512 tokens saved",
        process=proc,
        limit_s=2 * LIMIT_S,
    )
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL

    [chain] = index.all()
    done = index.cached_tokens(chain)  # the blocks finished before the kill
    assert done % 64 == 0 and 40 * 64 <= done < 6020
    result = CliRunner().invoke(app, ["ask", str(path), QUESTION, "-n", "1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["cached_tokens"], out["prefill_tokens"]) == (done, len(prompt.ids) - done)
    assert index.cached_tokens(index.load(chain.id)) == 6020  # the rest is saved now
