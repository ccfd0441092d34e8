"""Model configuration, named after the fields of a Hugging Face `config.json`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .config_keys import refuse_unimplemented, rope_settings


@dataclass
class ModelConfig:
    architecture: str = "llama"
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_hidden_layers: int = 30
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Share of each head's channels that RoPE rotates (the first ones); None: 1.0, or
    # `rotary_dim / head_dim` for configs that name a rotary_dim (MiniMax).
    partial_rotary_factor: float | None = None
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # Tokens per KV block: the unit of sparse attention, the disk cache and source passages.
    kv_block_size: int = 64
    # Per-frequency divisors of RoPE's inverse frequencies, as Llama 3.1/3.2 GGUF files store
    # their `llama3` RoPE scaling (the `rope_freqs.weight` tensor); None: none.
    rope_freq_factors: list[float] | None = None
    # RoPE scaling (config_keys.rope_settings: `rope_type` and its parameters), None: plain
    rope_scaling: dict | None = None
    attention_bias: bool = False  # q, k, v and o projections with biases
    mlp_bias: bool = False  # gate, up and down projections with biases

    # The config keys that change the math (config_keys.MATH_KEYS) this family computes; any
    # other such key with an effect is refused by `from_dict`.
    implemented_keys: ClassVar[frozenset[str]] = frozenset(
        {"partial_rotary_factor", "rope_scaling", "rope_parameters", "attention_bias", "mlp_bias"}
    )
    rope_types: ClassVar[tuple[str, ...]] = ("linear", "dynamic", "yarn", "llama3")  # scalings
    activations: ClassVar[tuple[str, ...]] = ("silu",)  # the MLP's, by transformers' names
    # transformers' default where a config.json leaves the key out (LlamaConfig: untied)
    tie_word_embeddings_default: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.partial_rotary_factor is None:
            rotary_dim = getattr(self, "rotary_dim", None)
            self.partial_rotary_factor = rotary_dim / self.head_dim if rotary_dim else 1.0

    @property
    def rope_dim(self) -> int:
        """Channels of each head that RoPE rotates."""
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window (None: a global layer); () when every layer is global."""
        return ()

    @property
    def group_size(self) -> int:
        """Query heads that share one KV head (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        """Build from a checkpoint's config: keys that change the math are computed or refused
        (config_keys.py), keys that do not are ignored; keys a config.json may leave out take
        transformers' defaults."""
        family = d.get("model_type") or cls.architecture
        refuse_unimplemented(d, family, cls.implemented_keys, cls.activations)
        names = {f.name for f in dataclasses.fields(cls)}
        # transformers 5 writes rope settings under `rope_parameters`; older configs at the top
        # level
        rope = d.get("rope_parameters") or {}
        d = {**{k: rope[k] for k in ("rope_theta", "partial_rotary_factor") if k in rope}, **d}
        kwargs = {k: v for k, v in d.items() if k in names}
        kwargs["rope_scaling"] = rope_settings(d, family, cls.rope_types)
        if "architecture" not in kwargs and d.get("model_type"):
            kwargs["architecture"] = d["model_type"]
        kwargs.setdefault("tie_word_embeddings", cls.tie_word_embeddings_default)
        if "num_attention_heads" in kwargs:  # no GQA unless the config says
            kwargs.setdefault("num_key_value_heads", kwargs["num_attention_heads"])
        return cls(**kwargs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def tiny(cls, **overrides) -> ModelConfig:
        """A few-layer random model for unit tests."""
        base = dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            rope_theta=10000.0,
            max_position_embeddings=512,
            kv_block_size=16,
        )
        base.update(overrides)
        return cls(**base)


@dataclass
class Qwen3Config(ModelConfig):
    """Qwen3: a Llama layout plus per-head RMSNorm of q and k."""

    architecture: str = "qwen3"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    max_position_embeddings: int = 40960

    # transformers' Qwen3 MLP has no biases whatever `mlp_bias` says
    implemented_keys = ModelConfig.implemented_keys - {"mlp_bias"}

    @classmethod
    def tiny(cls, **overrides) -> Qwen3Config:
        base = dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            rope_theta=10000.0,
            max_position_embeddings=512,
            kv_block_size=16,
            tie_word_embeddings=False,
        )
        base.update(overrides)
        return cls(**base)


@dataclass
class MiniMaxM2Config(ModelConfig):
    """MiniMax-M2: sigmoid-routed MoE in every layer, QK RMSNorm over all heads, partial RoPE."""

    architecture: str = "minimax_m2"
    vocab_size: int = 200064
    hidden_size: int = 3072
    intermediate_size: int = 1536  # of one expert
    num_hidden_layers: int = 62
    num_attention_heads: int = 48
    num_key_value_heads: int = 8
    head_dim: int | None = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 5000000.0
    max_position_embeddings: int = 196608
    tie_word_embeddings: bool = False
    num_local_experts: int = 256
    num_experts_per_tok: int = 8
    rotary_dim: int | None = None  # legacy spelling of partial_rotary_factor

    implemented_keys = frozenset({"partial_rotary_factor", "use_qk_norm"})

    @classmethod
    def tiny(cls, **overrides) -> MiniMaxM2Config:
        base = dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rope_theta=10000.0,
            partial_rotary_factor=0.5,
            max_position_embeddings=512,
            kv_block_size=16,
            num_local_experts=6,
            num_experts_per_tok=2,
        )
        base.update(overrides)
        return cls(**base)


@dataclass
class MiniMaxM3Config(ModelConfig):
    """MiniMax-M3's text model: per-head Gemma QK norm, clamped SwiGLU, MoE with a shared expert,
    dense or MoE MLP per layer, and on `minimax_m3_sparse` layers the MSA indexer."""

    architecture: str = "minimax_m3_vl"
    vocab_size: int = 200064
    hidden_size: int = 6144
    intermediate_size: int = 3072  # of one routed expert
    num_hidden_layers: int = 60
    num_attention_heads: int = 64
    num_key_value_heads: int = 4
    head_dim: int | None = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 5000000.0
    max_position_embeddings: int = 524288
    tie_word_embeddings: bool = False
    num_local_experts: int = 128
    num_experts_per_tok: int = 4
    dense_intermediate_size: int = 12288
    shared_intermediate_size: int = 3072
    routed_scaling_factor: float = 2.0
    rotary_dim: int | None = 64
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    layer_types: list | None = None  # "full_attention" | "minimax_m3_sparse" per layer
    mlp_layer_types: list | None = None  # "dense" | "sparse" (MoE) per layer
    index_n_heads: int = 4
    index_head_dim: int = 128
    index_block_size: int = 128
    index_topk_blocks: int = 16
    index_local_blocks: int = 1

    implemented_keys = frozenset({"partial_rotary_factor", "use_qk_norm", "layer_types"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_types is None:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        if self.mlp_layer_types is None:
            self.mlp_layer_types = ["sparse"] * self.num_hidden_layers
        if (
            "minimax_m3_sparse" in self.layer_types
            and self.index_n_heads != self.num_key_value_heads
        ):
            raise ValueError(
                f"index_n_heads ({self.index_n_heads}) must equal num_key_value_heads "
                f"({self.num_key_value_heads}): one block selection per KV group"
            )

    @classmethod
    def from_dict(cls, d: dict) -> MiniMaxM3Config:
        """Read the text model's part of an M3 config (`text_config`), legacy spellings included."""
        text = dict(d.get("text_config") or d)
        sparse = text.pop("sparse_attention_config", None) or {}
        for ours, legacy in [
            ("index_n_heads", "sparse_num_index_heads"),
            ("index_head_dim", "sparse_index_dim"),
            ("index_block_size", "sparse_block_size"),
            ("index_topk_blocks", "sparse_topk_blocks"),
            ("index_local_blocks", "sparse_local_block"),
        ]:
            if legacy in sparse:
                text[ours] = sparse[legacy]
        if "layer_types" not in text and "sparse_attention_freq" in sparse:
            text["layer_types"] = [
                "minimax_m3_sparse" if f else "full_attention"
                for f in sparse["sparse_attention_freq"]
            ]
        if "mlp_layer_types" not in text and "moe_layer_freq" in text:
            text["mlp_layer_types"] = ["sparse" if f else "dense" for f in text["moe_layer_freq"]]
        text["architecture"] = cls.architecture
        # KV blocks (prefix cache, passages) line up with the blocks the indexer selects
        text.setdefault("kv_block_size", text.get("index_block_size", cls.index_block_size))
        return super().from_dict(text)

    @classmethod
    def tiny(cls, **overrides) -> MiniMaxM3Config:
        base = dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rope_theta=10000.0,
            rotary_dim=8,
            max_position_embeddings=512,
            kv_block_size=8,
            num_local_experts=6,
            num_experts_per_tok=2,
            dense_intermediate_size=48,
            shared_intermediate_size=24,
            layer_types=["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"],
            mlp_layer_types=["dense", "sparse", "sparse"],
            index_n_heads=2,
            index_head_dim=16,
            index_block_size=8,
            index_topk_blocks=3,
            index_local_blocks=1,
        )
        base.update(overrides)
        return cls(**base)
