"""Damaged model files: random bytes, truncations, overwritten bytes and metadata of the wrong
type or range, in a tiny GGUF (written here by the `gguf` package) and a tiny safetensors model
folder. Loading must end in ModelError (one line, exit 4 on the command line) or in a model;
never in another exception. Hypothesis draws the cases, the same ones on every run
(`derandomize`); MSA_FUZZ_SCALE=10 runs ten times as many (README, "Reliability")."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_checkpoints import random_llama_weights, write_tiny_gguf
from typer.testing import CliRunner

from msa.models import ModelConfig, ModelError
from msa.models.loading import load_model

gguf = pytest.importorskip("gguf")

SCALE = int(os.environ.get("MSA_FUZZ_SCALE", "1"))  # read at import: the test home clears MSA_*
# cases per test (README's Reliability section quotes them)
GGUF_BYTES, GGUF_FIELDS, SAFETENSORS_BYTES, CONFIG_FIELDS, CLI_FILES = 120, 150, 200, 120, 20
EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "harbor-town.txt")
CONFIG = ModelConfig.tiny(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=262, num_hidden_layers=2,
)  # fmt: skip


def fuzz(examples: int):
    return settings(
        max_examples=examples * SCALE,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.fixture(scope="module")
def good_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "good.gguf"
    write_tiny_gguf(path, CONFIG, random_llama_weights(CONFIG), qtype="Q8_0")
    load_model(str(path))  # the undamaged file loads
    return path


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory) -> Path:
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models

    folder = tmp_path_factory.mktemp("fuzz") / "model"
    folder.mkdir()
    config = ModelConfig.tiny(vocab_size=8)
    weights = random_llama_weights(config)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
    fields += ("num_attention_heads", "num_key_value_heads", "tie_word_embeddings")
    raw = {"model_type": "llama", "eos_token_id": 1} | {f: getattr(config, f) for f in fields}
    (folder / "config.json").write_text(json.dumps(raw))
    vocab = {t: i for i, t in enumerate(["<s>", "</s>", "a", "b", " ", "?", "\n", ":"])}
    (folder / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, "a")).to_str())
    load_model(str(folder))
    return folder


def damaged(data: bytes, draw_from) -> bytes:
    """`data` truncated, with bytes overwritten (mostly in the header), or random bytes."""
    kind = draw_from(st.sampled_from(["truncate", "overwrite", "random"]))
    if kind == "truncate":
        return data[: draw_from(st.integers(0, len(data) - 1))]
    if kind == "random":
        return draw_from(st.binary(max_size=4096))
    out = bytearray(data)
    where = st.one_of(st.integers(0, min(len(data), 4096) - 1), st.integers(0, len(data) - 1))
    for at, byte in draw_from(
        st.lists(st.tuples(where, st.integers(0, 255)), min_size=1, max_size=8)
    ):
        out[at] = byte
    return bytes(out)


def loads_or_model_error(spec: str, **kwargs) -> None:
    try:
        load_model(spec, **kwargs)
    except ModelError as e:
        assert "\n" not in str(e)


@fuzz(GGUF_BYTES)
@given(data=st.data())
def test_damaged_gguf_bytes(good_gguf, tmp_path, data):
    path = tmp_path / "model.gguf"
    path.write_bytes(damaged(good_gguf.read_bytes(), data.draw))
    with tempfile.TemporaryDirectory() as converted:
        loads_or_model_error(str(path), converted_root=Path(converted))


ODD_VALUES = st.one_of(
    st.none(),  # the key removed
    st.text(max_size=8),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(),
    st.booleans(),
    st.lists(st.integers(min_value=-(2**31), max_value=2**31), max_size=4),
    st.lists(st.text(max_size=4), max_size=4),
)


@fuzz(GGUF_FIELDS)
@given(data=st.data())
def test_gguf_metadata_of_the_wrong_type_or_range(good_gguf, tmp_path, monkeypatch, data):
    from msa.models import gguf_loader
    from msa.models.gguf_header import read_header

    path = good_gguf
    header = read_header(path)
    fields = dict(header.fields)
    key = data.draw(st.sampled_from(sorted(fields)))
    value = data.draw(ODD_VALUES)
    if value is None:
        del fields[key]
    else:
        fields[key] = value
    odd = dataclasses.replace(header, fields=fields)
    monkeypatch.setattr(gguf_loader, "read_model_header", lambda _: odd)
    with tempfile.TemporaryDirectory() as converted:
        loads_or_model_error(str(path), converted_root=Path(converted))


def _copy_of(good_folder: Path, tmp_path: Path, names: tuple[str, ...]) -> Path:
    """A model folder under `tmp_path` holding `names` copied from `good_folder`."""
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_bytes((good_folder / name).read_bytes())
    return folder


@fuzz(SAFETENSORS_BYTES)
@given(data=st.data())
def test_damaged_safetensors_bytes(good_folder, tmp_path, data):
    folder = _copy_of(good_folder, tmp_path, ("config.json", "tokenizer.json"))
    weights = (good_folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(damaged(weights, data.draw))
    loads_or_model_error(str(folder))


@fuzz(CONFIG_FIELDS)
@given(data=st.data())
def test_config_json_of_the_wrong_type_or_range(good_folder, tmp_path, data):
    folder = _copy_of(good_folder, tmp_path, ("model.safetensors", "tokenizer.json"))
    raw = json.loads((good_folder / "config.json").read_text())
    keys = sorted(raw) + ["rope_theta", "rms_norm_eps", "head_dim", "max_position_embeddings"]
    key = data.draw(st.sampled_from(keys))
    value = data.draw(ODD_VALUES.filter(lambda v: v is None or json.dumps(v, allow_nan=True)))
    raw.pop(key, None) if value is None else raw.__setitem__(key, value)
    (folder / "config.json").write_text(json.dumps(raw))
    loads_or_model_error(str(folder))


@fuzz(CLI_FILES)
@given(data=st.data())
def test_msa_ask_with_a_damaged_model_says_one_line_and_exits_4(
    good_gguf, good_folder, tmp_path, data
):
    if data.draw(st.booleans()):
        model = tmp_path / "model.gguf"
        whole = good_gguf.read_bytes()
        model.write_bytes(whole[: data.draw(st.integers(0, len(whole) - 1))])
    else:
        model = tmp_path / "folder"
        model.mkdir(exist_ok=True)
        for name in ("config.json", "tokenizer.json"):
            (model / name).write_bytes((good_folder / name).read_bytes())
        weights = (good_folder / "model.safetensors").read_bytes()
        (model / "model.safetensors").write_bytes(data.draw(st.binary(max_size=len(weights) // 2)))
    result = CliRunner().invoke(app_(), ["ask", EXAMPLE, "What?", "--model", str(model), "-q"])
    assert result.exit_code == 4, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("msa: error: ") and result.stderr.count("\n") == 1


def app_():
    from msa.app import app

    return app
