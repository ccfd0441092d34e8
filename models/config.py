"""Model configuration, named after the fields of a Hugging Face `config.json`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


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
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # Tokens per KV block: the unit of sparse attention, the disk cache and source passages.
    kv_block_size: int = 64

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @property
    def group_size(self) -> int:
        """Query heads that share one KV head (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Build from a checkpoint's config, ignoring keys this project does not use."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        if "architecture" not in kwargs and d.get("model_type"):
            kwargs["architecture"] = d["model_type"]
        return cls(**kwargs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def tiny(cls, **overrides) -> "ModelConfig":
        """A few-layer random model for unit tests."""
        base = dict(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=6, num_key_value_heads=2, rope_theta=10000.0,
            max_position_embeddings=512, kv_block_size=16,
        )
        base.update(overrides)
        return cls(**base)
