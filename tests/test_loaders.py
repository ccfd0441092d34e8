"""Loaders (GGUF and Hugging Face directories) against transformers on tiny random checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_close, exact_kv
from tiny_checkpoints import CHAT_TEMPLATE, random_llama_weights, write_tiny_gguf

from msa.models import ModelConfig, ModelError
from msa.models.loading import load_model

transformers = pytest.importorskip("transformers")


def tiny_config(**kw) -> ModelConfig:
    # head_dim 32 (hidden 192 / 6 heads): every tensor row is a multiple of GGUF's block of 32
    base = dict(
        vocab_size=262,
        hidden_size=192,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        rope_theta=10000.0,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    base.update(kw)
    return ModelConfig(**base)


def hf_llama(config: ModelConfig, weights) -> transformers.LlamaForCausalLM:
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(hf_config).eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    model.tie_weights()
    return model


def reference_logits(hf_model, ids):
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0]


def test_gguf_f32_matches_transformers(tmp_path):
    config = tiny_config()
    weights = random_llama_weights(config)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, config, weights)
    loaded = load_model(str(path), converted_root=tmp_path / "converted")
    ids = loaded.tokenizer.encode("hello <|im_end|> world")
    assert 2 in ids  # the control token is parsed whole
    actual = loaded.model(
        torch.tensor(ids), loaded.model.new_cache(settings=exact_kv()), all_logits=True
    )
    assert_close(
        actual, reference_logits(hf_llama(config, weights), ids), atol=1e-4, what="gguf f32"
    )
    # the second load maps the converted copy and gives the same model
    again = load_model(str(path), converted_root=tmp_path / "converted", fuse=False)
    loaded = load_model(str(path), converted_root=tmp_path / "converted", fuse=False)
    assert again.digest == loaded.digest
    assert torch.equal(
        again.model.layers[1].self_attn.k_proj.weight,
        loaded.model.layers[1].self_attn.k_proj.weight,
    )


@pytest.mark.parametrize(
    "qtype,tolerance", [("F16", 1e-3), ("Q8_0", 0.01), ("Q4_1", 0.05), ("Q4_0", 0.08)]
)
def test_gguf_quantized_weights_dequantize_near_the_originals(tmp_path, qtype, tolerance):
    config = tiny_config()
    weights = random_llama_weights(config)
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_tiny_gguf(path, config, weights, qtype=qtype)
    as_stored = {"F16": "fp32", "Q8_0": "Q8_0", "Q4_1": "int4", "Q4_0": "int4"}[qtype]
    stored = load_model(str(path), converted_root=None)
    assert stored.weights == as_stored
    loaded = load_model(str(path), converted_root=None, fuse=False, quant="none")
    if qtype == "Q8_0":  # kept in its blocks: the same weights, q/k rows read in Llama's order
        ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
        got = stored.model(ids, stored.model.new_cache(settings=exact_kv()), all_logits=True)
        expected = loaded.model(ids, loaded.model.new_cache(settings=exact_kv()), all_logits=True)
        assert_close(got, expected, atol=1e-4, what="Q8_0 blocks")
    for ours, theirs in [
        ("layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("layers.1.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"),
    ]:
        got = dict(loaded.model.named_parameters())[ours]
        # tolerance: a fraction of the weights' spread (~0.1), by the format's step size
        assert_close(got, weights[theirs], atol=tolerance, what=f"{qtype} {ours}")


def test_gguf_missing_tensor_is_reported_by_name(tmp_path):
    config = tiny_config()
    path = tmp_path / "broken.gguf"
    write_tiny_gguf(path, config, random_llama_weights(config), skip=("blk.1.ffn_up.weight",))
    with pytest.raises(ModelError, match=r"missing layers\.1\.mlp\.up_proj\.weight"):
        load_model(str(path))


def test_not_a_gguf_file_is_a_model_error(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelError, match="not a readable GGUF"):
        load_model(str(path))


def test_hf_directory_matches_transformers(tmp_path, embedded):
    """A model directory as `save_pretrained` writes it, with the embedded model's tokenizer."""
    config = tiny_config(vocab_size=49152, tie_word_embeddings=False)
    weights = random_llama_weights(config, seed=1)
    hf_model = hf_llama(config, weights)
    folder = tmp_path / "tiny-llama"
    hf_model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(embedded.tokenizer.to_json())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>"})
    )
    loaded = load_model(str(folder))
    ids = loaded.tokenizer.encode("The capital of France is")
    actual = loaded.model(
        torch.tensor(ids), loaded.model.new_cache(settings=exact_kv()), all_logits=True
    )
    assert_close(actual, reference_logits(hf_model, ids), atol=1e-4, what="hf dir")
    assert loaded.tokenizer.eos_ids == [2]


def test_hf_base_model_without_template_gets_a_plain_prompt(tmp_path):
    """No chat template: the plain prompt, starting with BOS as tokenizer_config asks."""
    from tokenizers import Tokenizer, models

    config = tiny_config(vocab_size=8)
    folder = tmp_path / "base"
    hf_llama(config, random_llama_weights(config)).save_pretrained(folder)
    vocab = {t: i for i, t in enumerate(["<s>", "</s>", "a", "b", " ", "?", "\n", ":"])}
    (folder / "tokenizer.json").write_text(Tokenizer(models.WordLevel(vocab, "a")).to_str())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True})
    )
    template = load_model(str(folder)).tokenizer.template
    assert template.form.startswith("a plain document-then-question prompt")
    assert template.render([{"role": "user", "content": "a b?"}]) == "<s>a b?\n\nAnswer:"


def test_unknown_model_name(tmp_path):
    with pytest.raises(ModelError, match="unknown model 'no-such-model'"):
        load_model("no-such-model")


def test_remembered_file_digests_follow_every_change_of_the_file(tmp_path, monkeypatch):
    import hashlib
    import os

    from msa.models import digests
    from msa.models.digests import file_digest

    f, memo = tmp_path / "weights.bin", tmp_path / "digests"
    f.write_bytes(b"a" * 1000)
    file_digest(f, memo)
    assert not memo.exists()  # just written: not remembered yet
    monkeypatch.setattr(digests, "SETTLED_NS", 0)
    assert file_digest(f, memo) == hashlib.sha256(b"a" * 1000).hexdigest() == file_digest(f)
    assert len(list(memo.iterdir())) == 1
    assert file_digest(f, memo) == hashlib.sha256(b"a" * 1000).hexdigest()  # from the memo
    before = f.stat()
    f.write_bytes(b"b" * 1000)  # same size, mtime set back: the change time still moves
    while f.stat().st_ctime_ns == before.st_ctime_ns:  # until the file clock has ticked
        f.write_bytes(b"b" * 1000)
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert file_digest(f, memo) == hashlib.sha256(b"b" * 1000).hexdigest()
    next(memo.iterdir()).write_text("{not json")  # a damaged memo is ignored and rewritten
    assert file_digest(f, memo) == hashlib.sha256(b"b" * 1000).hexdigest()
