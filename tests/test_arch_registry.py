"""The registry behind `msa models`: parameter counts recounted from each model's config,
bytes at each precision, the GPU-cluster flag, and hub-cache resolution."""

from __future__ import annotations

import pytest
import torch

from msa.models import ModelError
from msa.models.architectures import config_class, model_class
from msa.models.registry import KNOWN_MODELS, model_table, resolve

# config.json excerpts of the published checkpoints
CONFIGS = {
    "smollm2-360m": dict(
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "smollm2-1.7b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        tie_word_embeddings=True,
    ),
    "qwen3-1.7b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen3-4b": dict(
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
}


def count(architecture: str, **config) -> tuple[int, int]:
    """(all parameters, those of routed experts) of our module built on the meta device."""
    cfg = config_class(architecture)(**config)
    with torch.device("meta"):
        model = model_class(architecture)(cfg)
    named = list(model.named_parameters())  # tied weights once
    return sum(p.numel() for _, p in named), sum(p.numel() for n, p in named if ".experts." in n)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_dense_model_parameters_match_their_config(name):
    model = KNOWN_MODELS[name]
    assert count(model.architecture, **CONFIGS[name])[0] == model.parameters


def test_embedded_model_parameters_match_its_file(embedded_gguf):
    import gguf

    reader = gguf.GGUFReader(str(embedded_gguf))
    total = sum(int(t.n_elements) for t in reader.tensors)
    assert total == KNOWN_MODELS["smollm2-135m"].parameters


@pytest.mark.parametrize(
    "name,layers", [("minimax-m2", {"sparse": 62}), ("minimax-m3", {"dense": 3, "sparse": 57})]
)
def test_moe_parameters_match_their_config(name, layers):
    """Counted per layer kind (building all 62 layers of 256 experts takes seconds)."""
    model = KNOWN_MODELS[name]
    m3 = model.architecture == "minimax_m3_vl"

    def one(kind=None):
        extra = {}
        if m3:
            attention = "full_attention" if kind == "dense" else "minimax_m3_sparse"
            extra = dict(
                layer_types=[attention] if kind else [], mlp_layer_types=[kind] if kind else []
            )
        else:
            extra = dict(rotary_dim=64)
        return count(model.architecture, num_hidden_layers=1 if kind else 0, **extra)

    base_total, _ = one()
    total, routed = base_total, 0
    for kind, n in layers.items():
        t, r = one(kind)
        total += n * (t - base_total)
        routed += n * r
    cfg = config_class(model.architecture)()
    assert total == model.parameters
    assert (
        total - routed + routed * cfg.num_experts_per_tok // cfg.num_local_experts
        == model.active_parameters
    )


def test_table_gives_bytes_context_and_cluster_flag():
    rows = {r["name"]: r for r in model_table()}
    assert set(rows) >= {
        "smollm2-135m",
        "smollm2-360m",
        "smollm2-1.7b",
        "llama-3.2-1b",
        "qwen3-1.7b",
        "minimax-m2",
        "minimax-m3",
    }
    m2 = rows["minimax-m2"]
    assert m2["needs_gpu_cluster"] and rows["minimax-m3"]["needs_gpu_cluster"]
    assert not any(r["needs_gpu_cluster"] for n, r in rows.items() if not n.startswith("minimax"))
    assert (
        m2["bytes"]["bf16"] == 2 * m2["parameters"]
        and m2["bytes"]["int4"] == m2["parameters"] * 6 // 8
    )
    assert m2["active_parameters"] < m2["parameters"] / 10
    assert rows["qwen3-1.7b"]["context_length"] == 32768


def test_cluster_models_point_to_a_remote_engine():
    with pytest.raises(ModelError, match="needs a GPU cluster"):
        resolve("minimax-m3")


def test_hub_models_resolve_to_the_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="not downloaded"):
        resolve("qwen3-4b")
    snapshot = tmp_path / "models--Qwen--Qwen3-4B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="not downloaded"):  # no weights yet: an interrupted pull
        resolve("qwen3-4b")
    (snapshot / "model.safetensors").write_bytes(b"")
    assert resolve("qwen3-4b").path == snapshot and resolve("qwen3-4b").format == "hf"
    assert resolve("Qwen/Qwen3-4B").path == snapshot
