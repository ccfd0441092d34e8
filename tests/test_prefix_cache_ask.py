"""The prefix cache in `msa ask`, end to end with the real embedded model (one process)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_close
from typer.testing import CliRunner

from msa.app import app
from msa.engine.prefix_cache import BlockStore, CacheOptions, ChainIndex, format_size
from msa.engine.prefix_cache.keys import FORMAT_VERSION
from msa.engine.prompt import build_prompt
from msa.engine.reading import open_prefix_cache, prefill_prompt
from msa.engine.settings import Settings
from msa.models.attention_settings import AttentionSettings

pytestmark = pytest.mark.slow

QUESTION = "What did the keeper see in entry 3?"
SKIES = ["grey", "clear", "stormy", "red", "pale"]


def logbook(n_entries: int, *, first: int = 0) -> str:
    """A made-up logbook, about 20 tokens per entry."""
    return (
        "\n".join(
            f"Entry {i}: the keeper counted {i * 7 % 23} ships under a {SKIES[i % 5]} sky."
            for i in range(first, first + n_entries)
        )
        + "\n"
    )


@pytest.fixture
def run(embedded):
    runner = CliRunner()

    def invoke(*args, input=None, env=None):
        return runner.invoke(app, [str(a) for a in args], input=input, env=env)

    return invoke


def prefix_root(home: Path) -> Path:
    return home / ".cache" / "msa" / "prefix"


def ask_json(run, *args, input=None) -> dict:
    result = run("ask", *args, "-n", "4", "--json", input=input)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # --json: no notes
    return json.loads(result.stdout)


def block_files(root: Path) -> set[str]:
    return {key for key, _, _ in BlockStore(root).files() if key is not None}


def stored_for(loaded, path: Path, text: str, question: str, root: Path):
    """The PrefixCache `msa ask` opens for this document (its keys name the block files)."""
    prompt = build_prompt(loaded.tokenizer, text, question)
    cache = loaded.model.new_cache(capacity=len(prompt.ids))
    settings = Settings(prefix_cache=CacheOptions(root))
    return (
        prompt,
        cache,
        open_prefix_cache(loaded, cache, prompt, str(path), settings),
    )


# ---- a document already read -----------------------------------------------------------------


@pytest.fixture(scope="module")
def populated(embedded, tmp_path_factory):
    """A document asked about once: its path, that first ask's JSON, and the prefix cache it
    left."""
    folder = tmp_path_factory.mktemp("populated")
    text = logbook(10)
    (folder / "log.txt").write_text(text)
    cache_dir = folder / "cache"
    result = CliRunner().invoke(
        app,
        [
            "ask",
            str(folder / "log.txt"),
            QUESTION,
            "-n",
            "4",
            "--json",
            "--cache-dir",
            str(cache_dir),
        ],
    )
    assert result.exit_code == 0, result.output
    return folder / "log.txt", json.loads(result.stdout), cache_dir / "prefix"


@pytest.fixture
def prefilled(populated, isolated_home):
    """This test's own copy of the populated prefix cache; (document, first ask's JSON)."""
    source, first, pristine = populated
    shutil.copytree(pristine, prefix_root(isolated_home))
    return source, first


def test_the_second_question_reads_only_the_question_however_the_document_arrives(
    run, embedded, prefilled, tmp_path, isolated_home
):
    path, first = prefilled
    other = tmp_path / "elsewhere" / "copy.txt"
    other.parent.mkdir()
    shutil.copy(path, other)
    text = path.read_text()
    asked = build_prompt(embedded.tokenizer, text, QUESTION)
    second_q = "How many ships in entry 2?"
    second = build_prompt(embedded.tokenizer, text, second_q)
    assert second.context_length == asked.context_length == 41 + 166  # template head + document
    assert (first["prompt_tokens"], first["cached_tokens"], first["prefill_tokens"]) == (
        len(asked.ids),
        0,
        len(asked.ids),
    )

    reference = ask_json(run, path, second_q, "--no-cache")
    assert reference["cached_tokens"] == 0
    for source, stdin in [(path, None), (other, None), ("-", text)]:
        warm = ask_json(run, source, second_q, input=stdin)
        assert warm["cached_tokens"] == 207
        assert warm["prefill_tokens"] == len(second.tail) == warm["prompt_tokens"] - 207
        assert warm["answer"] == reference["answer"]
    # one document, one chain, whatever its path: 3 full blocks and a partial one of 15 tokens
    chains = ChainIndex(BlockStore(prefix_root(isolated_home))).all()
    assert [(c.tokens, len(c.blocks), c.source) for c in chains] == [(207, 4, "stdin")]
    assert len(block_files(prefix_root(isolated_home))) == 4


def test_logits_are_the_same_with_the_cache_and_without_it(embedded, prefilled, isolated_home):
    source, _ = prefilled
    root = prefix_root(isolated_home)

    def logits(*, cached: bool):
        prompt, cache, stored = stored_for(embedded, source, source.read_text(), QUESTION, root)
        stored = stored if cached else None
        restored = stored.restore(cache) if stored else 0
        return prefill_prompt(embedded.model, cache, prompt, stored), restored, stored

    none, _, _ = logits(cached=False)
    warm, restored, stored = logits(cached=True)  # blocks written by the first ask
    assert restored == stored.context_tokens == 207
    assert torch.equal(warm, none)  # bit for bit
    # resumed from block 2 (as after an interrupted prefill, or an edit there): chunks fall
    # elsewhere, so equal to float rounding, and the same greedy token
    for bk in stored.keys[2:]:
        stored.store.remove(bk.key)
    part, restored, _ = logits(cached=True)
    assert restored == 2 * 64
    assert_close(part, none, atol=1e-4, what="resumed prefill")
    assert int(part.argmax()) == int(none.argmax())
    assert logits(cached=True)[1] == 207  # and the resumed prefill saved the rest


@pytest.mark.parametrize("attention", ["msa", "auto"])
def test_under_msa_a_restored_document_gives_the_same_logits_and_answer(
    run, embedded, tmp_path, isolated_home, attention
):
    """Past sparse_from (1,024 tokens) `auto` reads with MSA too: the question's tokens select
    among restored blocks, by the block summaries restored with them."""
    path = tmp_path / "long.txt"
    path.write_text(logbook(90))
    text = path.read_text()
    prompt = build_prompt(embedded.tokenizer, text, QUESTION)
    settings = Settings(
        prefix_cache=CacheOptions(prefix_root(isolated_home)),
        attention=AttentionSettings(mode=attention),
    )
    assert prompt.context_length > settings.attention.sparse_from

    cold = ask_json(run, path, QUESTION, "--attention", attention)
    warm = ask_json(run, path, QUESTION, "--attention", attention)
    assert (cold["cached_tokens"], warm["cached_tokens"]) == (0, prompt.context_length)
    assert warm["answer"] == cold["answer"]

    def logits(*, cached: bool):
        cache = embedded.model.new_cache(capacity=len(prompt.ids), settings=settings.attention)
        stored = open_prefix_cache(embedded, cache, prompt, str(path), settings)
        stored = stored if cached else None
        assert (stored.restore(cache) if stored else 0) == (prompt.context_length if cached else 0)
        return prefill_prompt(embedded.model, cache, prompt, stored)

    assert torch.equal(logits(cached=True), logits(cached=False))  # bit for bit


def test_an_edit_in_the_middle_recomputes_only_the_blocks_from_it_on(
    run, embedded, prefilled, tmp_path, isolated_home
):
    root = prefix_root(isolated_home)
    source, _ = prefilled
    text = source.read_text()
    edited = text.replace("Entry 4: the keeper counted", "Entry 4: the keeper saw")
    before = block_files(root)
    original = build_prompt(embedded.tokenizer, text, QUESTION)
    changed = build_prompt(embedded.tokenizer, edited, QUESTION)
    first_diff = next(i for i, (a, b) in enumerate(zip(original.ids, changed.ids)) if a != b)
    assert (
        first_diff // 64 == 1 and -(-changed.context_length // 64) == 4
    )  # the edit is in block 1 of 4

    path = tmp_path / "log.txt"
    path.write_text(edited)
    out = ask_json(run, path, QUESTION)
    assert out["cached_tokens"] == 64
    assert out["prefill_tokens"] == len(changed.ids) - 64
    after = block_files(root)
    assert before <= after and len(after - before) == 4 - 1  # blocks 1, 2 and 3 are new
    assert ask_json(run, path, QUESTION)["cached_tokens"] == changed.context_length


# ---- corruption ------------------------------------------------------------------------------


def _flip_bytes(path: Path):
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 64, len(data)):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _rewrite_metadata(path: Path, **changes):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {n: f.get_tensor(n) for n in f.keys()}
    save_file(tensors, str(path), metadata={**meta, **changes})


@pytest.mark.parametrize(
    "damage,reason",
    [
        (
            lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
            "is truncated or not a block file",
        ),
        (_flip_bytes, "is corrupted (checksum mismatch)"),
        (
            lambda p: _rewrite_metadata(p, identity="0" * 64),
            "was made under another identity (model, tokenizer, template, dtype or attention)",
        ),
        (
            lambda p: _rewrite_metadata(p, format="0"),
            f"has format version 0, this msa reads {FORMAT_VERSION}",
        ),
    ],
)
def test_a_damaged_block_is_dropped_recomputed_and_reported(
    run, embedded, prefilled, isolated_home, damage, reason
):
    source, first = prefilled
    expected_answer = first["answer"] + "\n"
    root = prefix_root(isolated_home)
    _, _, stored = stored_for(embedded, source, source.read_text(), QUESTION, root)
    damage(stored.store.path(stored.keys[2].key))

    result = run("ask", source, QUESTION, "-n", "4")
    assert result.exit_code == 0, result.output
    assert result.stdout == expected_answer
    assert result.stderr.splitlines() == [
        f"msa: cache: block 2 of {source} {reason}: dropped, recomputing blocks 0-3 from token 0"
    ]
    out = ask_json(run, source, QUESTION)  # block 2 was written again, whole
    assert out["cached_tokens"] == stored.context_tokens
    assert out["answer"] + "\n" == expected_answer


def test_notes_are_quiet_and_read_only_changes_nothing(run, embedded, prefilled, isolated_home):
    source, first = prefilled
    expected_answer = first["answer"] + "\n"
    root = prefix_root(isolated_home)
    _, _, stored = stored_for(embedded, source, source.read_text(), QUESTION, root)
    _flip_bytes(stored.store.path(stored.keys[3].key))
    manifest = next((root / "chains").iterdir())
    stamp = manifest.read_bytes()

    result = run("ask", source, QUESTION, "-n", "4", "--cache-ro")
    assert result.stdout == expected_answer
    assert result.stderr == (
        f"msa: cache: block 3 of {source} is corrupted (checksum mismatch): "
        f"ignored (--cache-ro), recomputing blocks 0-3 from token 0\n"
    )
    assert stored.store.exists(stored.keys[3].key) and manifest.read_bytes() == stamp
    result = run("ask", source, QUESTION, "-n", "4", "--quiet")
    assert result.stdout == expected_answer and result.stderr == ""


def test_int8_kv_is_its_own_chain_a_quarter_of_the_bytes_and_answers_the_same_from_it(
    run, embedded, prefilled, isolated_home
):
    source, first = prefilled
    root = prefix_root(isolated_home)
    full_bytes = ChainIndex(BlockStore(root)).disk_bytes()
    reference = ask_json(run, source, QUESTION, "--kv-dtype", "int8", "--no-cache")
    cold = ask_json(run, source, QUESTION, "--kv-dtype", "int8")
    assert cold["cached_tokens"] == 0  # the full-precision chain is another identity
    assert cold["answer"] == reference["answer"]
    warm = ask_json(run, source, QUESTION, "--kv-dtype", "int8")
    assert warm["cached_tokens"] == 207 and warm["answer"] == reference["answer"]
    chains = ChainIndex(BlockStore(root)).all()
    assert len(chains) == 2
    int8_bytes = ChainIndex(BlockStore(root)).disk_bytes() - full_bytes
    assert int8_bytes < 0.6 * full_bytes  # int8 codes + a scale per row, vs fp16 rows
    # logits from the restored int8 blocks equal those of a cold int8 prefill, bit for bit
    settings = Settings(
        prefix_cache=CacheOptions(root), attention=AttentionSettings(kv_dtype="int8")
    )
    text = source.read_text()

    def logits(cached: bool):
        prompt = build_prompt(embedded.tokenizer, text, QUESTION)
        cache = embedded.model.new_cache(capacity=len(prompt.ids), settings=settings.attention)
        stored = (
            open_prefix_cache(embedded, cache, prompt, str(source), settings) if cached else None
        )
        assert (stored.restore(cache) if stored else 0) == (207 if cached else 0)
        return prefill_prompt(embedded.model, cache, prompt, stored)

    assert torch.equal(logits(cached=True), logits(cached=False))


def test_each_kv_dtype_is_its_own_chain_and_fp16_blocks_take_half_of_fp32s(
    run, embedded, prefilled, isolated_home
):
    """The default chain holds 2-byte K/V; an fp32 chain is another identity (never read as the
    other), its blocks twice the K/V bytes; each answers from its own blocks as it computed."""
    from safetensors import safe_open

    source, first = prefilled
    root = prefix_root(isolated_home)
    fp16_files = block_files(root)
    fp32_cold = ask_json(run, source, QUESTION, "--kv-dtype", "fp32")
    assert fp32_cold["cached_tokens"] == 0
    fp32_files = block_files(root) - fp16_files
    assert len(fp32_files) == len(fp16_files) == 4
    store = BlockStore(root)

    def kv_bytes(keys):
        total = 0
        for key in keys:
            with safe_open(str(store.path(key)), "pt") as f:
                kv = [f.get_tensor(name) for name in ("k", "v")]
            assert {t.dtype for t in kv} == {torch.float16 if keys is fp16_files else torch.float32}
            total += sum(t.numel() * t.element_size() for t in kv)
        return total

    assert kv_bytes(fp16_files) * 2 == kv_bytes(fp32_files)
    assert sum(map(store.size, fp16_files)) < 0.55 * sum(map(store.size, fp32_files))
    for kv_dtype in ("fp32", "fp16"):
        warm = ask_json(run, source, QUESTION, "--kv-dtype", kv_dtype)
        assert warm["cached_tokens"] == 207
    assert warm["answer"] == first["answer"]


# ---- budget ----------------------------------------------------------------------------------


def test_eviction_keeps_the_budget_and_the_running_document(
    run, embedded, prefilled, tmp_path, isolated_home, monkeypatch
):
    root = prefix_root(isolated_home)
    second = tmp_path / "b.txt"
    second.write_text(logbook(10, first=50))  # 217 tokens: as many blocks as the first
    one_document = ChainIndex(BlockStore(root)).disk_bytes()
    budget = one_document * 3 // 2  # room for one of them, not two
    monkeypatch.setenv("MSA_CACHE_MAX", str(budget))

    assert ask_json(run, second, QUESTION)["cached_tokens"] == 0
    index = ChainIndex(BlockStore(root))
    assert [c.source for c in index.all()] == [str(second)]
    assert index.disk_bytes() <= budget
    assert ask_json(run, second, QUESTION)["cached_tokens"] == index.all()[0].tokens


def test_a_document_over_the_budget_is_answered_and_not_kept(
    run, embedded, tmp_path, isolated_home, monkeypatch
):
    path = tmp_path / "log.txt"
    path.write_text(logbook(4))
    expected = run("ask", path, QUESTION, "-n", "4", "--cache-ro").stdout
    assert not prefix_root(isolated_home).exists()  # --cache-ro wrote nothing
    prompt, cache, _ = stored_for(embedded, path, path.read_text(), QUESTION, tmp_path / "unused")
    monkeypatch.setenv("MSA_CACHE_MAX", "1M")
    result = run("ask", path, QUESTION, "-n", "4")
    assert result.exit_code == 0 and result.stdout == expected
    # judged from the first block: its tensors' bytes per token, plus a 1 kB header per block
    embedded.model(torch.tensor(prompt.ids[:64]), cache)
    block_bytes = sum(t.nbytes for t in cache.export_block(0).values())
    estimate = block_bytes * prompt.context_length // 64 + 1024 * -(-prompt.context_length // 64)
    assert result.stderr == (
        f"msa: cache: {path} needs about {format_size(estimate)}, more than the cache's "
        f"1.0 MB budget (MSA_CACHE_MAX); answering without keeping it\n"
    )
    assert block_files(prefix_root(isolated_home)) == set()


def test_a_bad_budget_is_a_usage_error(run, tmp_path, monkeypatch):
    path = tmp_path / "log.txt"
    path.write_text(logbook(2))
    monkeypatch.setenv("MSA_CACHE_MAX", "lots")
    result = run("ask", path, QUESTION)
    assert result.exit_code == 2
    assert (
        result.stderr == "msa: error: MSA_CACHE_MAX: 'lots' is not a size (use e.g. 500M or 10G)\n"
    )


def test_a_cache_that_cannot_be_written_never_fails_the_ask(run, tmp_path):
    path = tmp_path / "log.txt"
    path.write_text(logbook(3))
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / "prefix").write_text("a file where the prefix cache's folder should be")
    result = run("ask", path, QUESTION, "-n", "2", "--cache-dir", cache_dir)
    assert result.exit_code == 0 and result.stdout.strip()
    assert (
        result.stderr == f"msa: cache: cannot write to {cache_dir / 'prefix'} (File exists); "
        "answering without saving\n"
    )


def test_the_index_selection_stores_its_index_and_answers_alike_from_the_cache(
    run, tmp_path, isolated_home
):
    """--selection index over a document past the dense prefix: every full block's file holds
    its index, and the second ask, its blocks restored with it, answers as the first did."""
    doc = tmp_path / "log.txt"
    doc.write_text(logbook(160))  # ~3,200 tokens: MSA from token 1,024
    args = (doc, QUESTION, "--selection", "index", "--mass", "0.9", "--topk", "8", "-n", "12")
    first = ask_json(run, *args)
    from safetensors.torch import load_file

    files = sorted((prefix_root(isolated_home) / "blocks").rglob("*.safetensors"))
    assert first["cached_tokens"] == 0 and files
    blocks = [load_file(f) for f in files]
    full = [b for b in blocks if b["k"].shape[2] == 64]
    assert len(full) >= 40 and all("index_codes" in b for b in full)  # every full block
    second = ask_json(run, *args)
    assert second["cached_tokens"] > 0.9 * second["prompt_tokens"]
    assert second["answer"] == first["answer"]
    # the index's budget is the question's and the answer's alone: the document's blocks serve
    # another --topk
    third = ask_json(run, doc, QUESTION, "--selection", "index", "--topk", "16", "-n", "12")
    assert third["cached_tokens"] > 0.9 * third["prompt_tokens"]
