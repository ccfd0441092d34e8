"""What msa keeps of the documents a user read is the user's alone: the prefix cache's folders
0700 and files 0600 (tightened when an older msa left them looser), its files named under a
secret of the cache, and the chat history 0600 (a tiny K/V cache: no model); and everything a
first `msa ask` writes in its cache and data folders (the real model, in a process of its own)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from processes import LIMIT_S, start_msa

from msa.engine.prefix_cache import BlockStore, CacheOptions, ChainIndex, PrefixCache, block_keys
from msa.engine.prefix_cache.tokens import MIN_CHARS, TokenMemo
from msa.models.kv_cache import KVCache

CONTEXT = list(range(100, 110))  # two full blocks of 4 tokens and a partial one
IDENTITY = {"model": "m", "attention": {"mode": "dense"}}


@pytest.fixture(autouse=True)
def permissive_umask():
    old = os.umask(0o022)  # the usual umask, which leaves new files readable by others
    yield
    os.umask(old)


def filled_kv() -> KVCache:
    kv = KVCache(2, 1, 4, block_size=4)
    gen = torch.Generator().manual_seed(0)
    for layer in range(2):
        k, v = (torch.randn(1, len(CONTEXT), 4, generator=gen) for _ in range(2))
        kv.write(layer, k, v)
    kv.advance(len(CONTEXT))
    return kv


def fill(root: Path) -> PrefixCache:
    stored = PrefixCache(
        CacheOptions(root), identity=IDENTITY, context=CONTEXT, block_size=4, source="d", model="m"
    )
    stored.save(filled_kv())
    return stored


def modes(root: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            found[str(path.relative_to(root))] = stat.S_IMODE(path.stat().st_mode)
    return found


def test_a_new_cache_is_private(tmp_path):
    root = tmp_path / "cache" / "prefix"
    stored = fill(root)
    TokenMemo(root, "tok").ids("x" * MIN_CHARS, lambda text: [1, 2, 3])
    found = modes(root)
    assert {"blocks", "chains", "tokens", "lock", "secret"} <= set(found)
    assert len([p for p in found if p.endswith(".safetensors")]) == 3 + 1  # blocks and token ids
    for path, mode in found.items():
        expected = 0o700 if (root / path).is_dir() else 0o600
        assert mode == expected, f"{path}: {mode:o}"
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700  # made by msa too
    assert ChainIndex(BlockStore(root)).cached_tokens(ChainIndex(BlockStore(root)).all()[0]) == 10
    assert stored.restore(KVCache(2, 1, 4, block_size=4)) == 10


def test_an_older_looser_cache_is_tightened_when_used(tmp_path):
    root = tmp_path / "prefix"
    for folder in ("blocks", "chains", "tokens"):
        (root / folder).mkdir(parents=True, mode=0o755)
        os.chmod(root / folder, 0o755)
    os.chmod(root, 0o755)
    fill(root)
    TokenMemo(root, "tok").ids("x" * MIN_CHARS, lambda text: [1, 2, 3])
    assert {path: mode for path, mode in modes(root).items() if mode & 0o077} == {}


def test_files_are_named_under_the_caches_secret(tmp_path):
    first, second = fill(tmp_path / "one"), fill(tmp_path / "two")
    content = [k.key for k in block_keys(first.identity, CONTEXT, 4)]
    on_disk = [k.key for k in first.keys]
    assert [first.store.exists(key) for key in on_disk] == [True] * 3
    assert not set(content) & set(on_disk)  # the recomputable content hashes name nothing
    assert not set(on_disk) & {k.key for k in second.keys}  # another cache, other names
    assert [k.key for k in fill(tmp_path / "one").keys] == on_disk  # the same cache: a hit
    assert len((tmp_path / "one" / "secret").read_bytes()) == 32


def test_the_chat_history_is_private(isolated_home, monkeypatch):
    from msa.commands import repl
    from msa.engine.paths import data_dir

    history = data_dir() / "chat_history"
    history.parent.mkdir(parents=True, mode=0o755, exist_ok=True)
    history.write_text("an older msa's question\n")
    os.chmod(history, 0o644)

    class Leave(Exception):
        pass

    def prompt_session(history, **kwargs):
        raise Leave  # the history file is set up before the prompt starts

    monkeypatch.setattr("prompt_toolkit.PromptSession", prompt_session)
    with pytest.raises(Leave):
        repl.run_repl(None, history)
    assert stat.S_IMODE(history.stat().st_mode) == 0o600
    assert stat.S_IMODE(history.parent.stat().st_mode) == 0o700
    assert history.read_text() == "an older msa's question\n"


@pytest.mark.slow
def test_what_a_first_ask_writes_is_private(isolated_home, monkeypatch, embedded_gguf):
    """A first `msa ask` on a machine, in a process of its own (a model loaded in this one
    writes nothing): its cache and data folders, made by msa, are 0700 and its files 0600."""
    from typer.testing import CliRunner

    from msa.app import app

    cache, data = isolated_home / "new-cache", isolated_home / "new-data"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    pulled = CliRunner().invoke(app, ["pull", str(embedded_gguf), "--name", "tiny", "-q"])
    assert pulled.exit_code == 0, pulled.output
    document = Path(__file__).resolve().parents[1] / "examples" / "harbor-town.txt"
    ask = start_msa("ask", document, "Who was the first keeper?", "-m", "tiny", "-n", "2", "-q")
    _, err = ask.communicate(timeout=LIMIT_S)
    assert ask.returncode == 0, err
    expected = {}
    for top, root in (("cache", cache), ("data", data)):
        for path, mode in modes(root).items():
            expected[f"{top}/{path}"] = (mode, 0o700 if (root / path).is_dir() else 0o600)
    assert {path: f"{m:o}" for path, (m, want) in expected.items() if m != want} == {}
    made = {"cache/.", "cache/msa", "cache/msa/models", "cache/msa/models/digests"}
    made |= {"cache/msa/read_speed.json", "cache/msa/prefix/secret"}
    made |= {"data/.", "data/msa", "data/msa/registered-models.json"}
    assert made <= set(expected)


def test_a_cache_folder_the_user_named_is_left_as_it_is(tmp_path):
    from msa.engine.read_speed import FILE_NAME, record_speed

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    (shared / FILE_NAME).write_text("{}")  # an older msa's, readable by others
    record_speed(shared, "m:1t:auto", tokens=1000, seconds=2.0)
    assert modes(shared) == {".": 0o755, FILE_NAME: 0o600}
    assert (shared / FILE_NAME).read_text() == '{\n "m:1t:auto": 500.0\n}'
