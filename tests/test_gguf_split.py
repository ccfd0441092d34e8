"""Split GGUF files as llama.cpp's gguf-split writes them (written here by gguf-py's writer,
which lays parts out the same way): the real embedded model split in three loads the same
weights and answers with the same logits as the file it was split from."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import exact_kv
from gguf_splitting import write_split

from msa.models.errors import ModelError
from msa.models.gguf_header import read_header
from msa.models.gguf_loader import load_gguf
from msa.models.gguf_split import model_parts, read_model_header
from msa.models.registry import KNOWN_MODELS, packaged_file


@pytest.fixture(scope="module")
def embedded_file():
    return packaged_file(KNOWN_MODELS["smollm2-135m"])


@pytest.fixture(scope="module")
def split_embedded(embedded_file, tmp_path_factory):
    """The embedded model in three parts of at most 100 tensors (it has 272)."""
    folder = tmp_path_factory.mktemp("split")
    return write_split(embedded_file, folder / "SmolLM2-135M-Instruct.Q4_1", 100)


def test_the_parts_hold_every_tensor_once_with_its_bytes(embedded_file, split_embedded):
    assert [p.name for p in split_embedded] == [
        f"SmolLM2-135M-Instruct.Q4_1-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]
    assert model_parts(split_embedded[0]) == split_embedded
    whole, split = read_header(embedded_file), read_model_header(split_embedded[0])
    assert [p.name for p in split.parts] == [p.name for p in split_embedded]
    assert [t.part for t in split.tensors] == [0] * 100 + [1] * 100 + [2] * 72
    by_name = {t.name: t for t in split.tensors}
    assert sorted(by_name) == sorted(t.name for t in whole.tensors)
    raw = embedded_file.read_bytes()
    parts = [p.read_bytes() for p in split_embedded]
    for t in whole.tensors:
        s = by_name[t.name]
        assert (s.type_name, s.shape, s.n_bytes) == (t.type_name, t.shape, t.n_bytes)
        data = raw[t.data_offset : t.data_offset + t.n_bytes]
        assert parts[s.part][s.data_offset : s.data_offset + s.n_bytes] == data, t.name
    meta = {k: v for k, v in split.fields.items() if not k.startswith("split.")}
    assert meta == whole.fields
    assert (split.fields["split.count"], split.fields["split.tensors.count"]) == (3, 272)


def test_a_split_model_loads_the_same_weights_and_logits(embedded_file, split_embedded, tmp_path):
    whole = load_gguf(embedded_file, tmp_path / "converted")
    split = load_gguf(split_embedded[0], tmp_path / "converted")
    assert split.digest != whole.digest  # a model of three files has its own identity
    assert sorted(split.weights) == sorted(whole.weights)
    for k, v in whole.weights.items():
        assert torch.equal(split.weights[k], v), k
    ids = whole.tokenizer.encode("The harbor town kept its lighthouse lit.")
    assert split.tokenizer.encode("The harbor town kept its lighthouse lit.") == ids

    from msa.models.loading import build_model

    logits = []
    for ckpt in (whole, split):
        model = build_model(ckpt)
        logits.append(
            model(torch.tensor(ids), model.new_cache(settings=exact_kv()), all_logits=True)
        )
    assert torch.equal(logits[0], logits[1])
    again = load_gguf(split_embedded[0], tmp_path / "converted")  # from the converted copy
    assert again.digest == split.digest
    assert all(torch.equal(again.weights[k], v) for k, v in whole.weights.items())


def test_a_first_part_of_metadata_alone(tmp_path):
    """gguf-split --no-tensor-first-split: the first part holds no tensor."""
    from test_loaders import tiny_config
    from tiny_checkpoints import random_llama_weights, write_tiny_gguf

    config = tiny_config()
    source = tmp_path / "tiny.gguf"
    write_tiny_gguf(source, config, random_llama_weights(config), qtype="Q8_0")
    parts = write_split(source, tmp_path / "tiny", 8, metadata_only_first=True)
    header = read_model_header(parts[0])
    assert read_header(parts[0]).tensors == [] and len(header.tensors) == len(
        read_header(source).tensors
    )
    a, b = load_gguf(source, None), load_gguf(parts[0], None)
    assert all(torch.equal(b.weights[k], v) for k, v in a.weights.items())


def test_parts_missing_misnamed_or_given_out_of_order_are_one_line(split_embedded, tmp_path):
    second = split_embedded[1]
    with pytest.raises(ModelError) as e:
        load_gguf(second, None)
    assert str(e.value) == (
        f"{second} is part 2 of a GGUF split in 3 files: give its first part, "
        "SmolLM2-135M-Instruct.Q4_1-00001-of-00003.gguf"
    )
    renamed = tmp_path / "model.gguf"
    shutil.copy(split_embedded[0], renamed)
    with pytest.raises(ModelError) as e:
        read_model_header(renamed)
    assert str(e.value) == (
        f"{renamed} is the first of 3 parts of a split GGUF but is not named "
        "model-00001-of-00003.gguf, so its other parts cannot be found"
    )
    alone = tmp_path / split_embedded[0].name
    shutil.copy(split_embedded[0], alone)
    shutil.copy(split_embedded[1], tmp_path / split_embedded[1].name)
    with pytest.raises(ModelError) as e:
        load_gguf(alone, None)
    assert str(e.value) == f"model file not found: {tmp_path / split_embedded[2].name}"
    (tmp_path / split_embedded[2].name).write_bytes(split_embedded[1].read_bytes())
    with pytest.raises(ModelError) as e:
        read_model_header(alone)
    assert str(e.value) == (
        f"{tmp_path / split_embedded[2].name} does not belong to its split GGUF: its split.no "
        "is 1 and its split.count 3, where part 3 of 3 has 2 and 3"
    )
