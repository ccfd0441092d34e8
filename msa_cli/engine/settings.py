"""What a session answers with: sampling, the attention, the prefix cache, sources."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from msa.models.attention_settings import AttentionSettings

from .limits import check_sampling
from .prefix_cache import CacheOptions


@dataclass
class Settings:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI's penalties on tokens already in the answer
    frequency_penalty: float = 0.0
    system: str | None = None
    attention: AttentionSettings = field(default_factory=AttentionSettings)
    prefix_cache: CacheOptions | None = None  # None: neither read nor write it
    # blocks are shared only by reads of one salt (vLLM's cache_salt): one client of a server
    # never learns from cached_tokens what another asked about
    cache_salt: str | None = None
    kv_spill_dir: Path | None = None  # K/V too large for memory go to files here
    sources: bool = False  # track which blocks each answer read (`Sources` events)
    speed_dir: Path | None = None  # where read speeds are remembered (`read_speed`)
    note: Callable[[str], None] | None = None  # the prefix cache's one-line notes (None: silent)

    def __post_init__(self):
        check_sampling(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            block_size=self.attention.block_size,
        )
