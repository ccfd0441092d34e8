"""`load` a model by name or path; a `Model` opens sessions over documents."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from msa.models.attention_settings import AttentionSettings

from .documents import Context, Document, read_context
from .loading import kernel_build_seconds, set_threads
from .loading import load as load_model
from .paths import cache_dir as resolve_cache_dir
from .prefix_cache import CacheOptions, budget_from_env, prefix_dir
from .session import Session
from .settings import Settings

DEFAULT_MODEL = "smollm2-135m"


def load(
    name: str = DEFAULT_MODEL,
    *,
    quant: str | None = None,
    dtype: str = "auto",
    threads: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Model:
    """Load a model: a registry name (`msa models`), a .gguf file or a model folder.

    `quant`: int8, int4 or none (the weights as the file stores them when None); `dtype`: auto
    (the default: fp32, a GGUF's Q4_K/Q6_K/Q5_0/Q8_0 layers prefilling on bf16 tiles where the
    CPU has AMX or AVX-512 BF16), fp32 (exact everywhere) or bf16; `threads`: PyTorch's CPU threads
    (when None: MSA_THREADS, else the cores free of other work, as `msa ask` runs; the count is
    `Model.threads`); `cache_dir`: where converted models, the prefix cache and spilled K/V
    live (msa's, $XDG_CACHE_HOME/msa, when None). A model loaded before in this process is not
    loaded again. The first load on a machine compiles msa's C++ kernels (minutes, said on
    stderr): `Model.build_s` holds those seconds, `Model.load_s` the rest.
    """
    n_threads = set_threads(threads)
    built_before = kernel_build_seconds()
    loaded, seconds = load_model(name, cache=cache_dir, quant=quant, dtype=dtype)
    model = Model(loaded, load_s=seconds, cache_dir=cache_dir, threads=n_threads)
    model.build_s = kernel_build_seconds() - built_before
    return model


class Model:
    """A loaded model (`loaded`: msa.models' LoadedModel) and where its caches live."""

    def __init__(self, loaded, *, load_s: float = 0.0, cache_dir=None, threads=None):
        self.loaded, self.load_s, self.threads = loaded, load_s, threads
        self.build_s = 0.0  # seconds spent compiling C++ kernels while loading
        self.cache_dir = resolve_cache_dir(cache_dir)

    @property
    def name(self) -> str:
        return self.loaded.name

    def settings(
        self,
        *,
        attention: AttentionSettings | str | None = None,
        prefix_cache: bool = True,
        cache_read_only: bool = False,
        **options,
    ) -> Settings:
        """Session settings under this model's cache directory: `attention` (AttentionSettings or
        a mode: auto, dense, msa); the prefix cache read and written (`prefix_cache=False`:
        neither; `cache_read_only`: read only); `options`: `Settings`' other fields (max_tokens,
        temperature, top_p, seed, system, sources, note, kv_spill_dir, speed_dir)."""
        if isinstance(attention, str):
            attention = AttentionSettings(mode=attention)
        cache = None
        if prefix_cache:
            cache = CacheOptions(
                prefix_dir(self.cache_dir), max_bytes=budget_from_env(), read_only=cache_read_only
            )
        defaults = {"kv_spill_dir": self.cache_dir / "kv", "speed_dir": self.cache_dir}
        return Settings(
            attention=attention or AttentionSettings(),
            prefix_cache=cache,
            **{**defaults, **options},
        )

    def session(
        self,
        documents: str | os.PathLike | Sequence[str | os.PathLike] | Context | Document = (),
        *,
        text: str | None = None,
        settings: Settings | None = None,
        **options,
    ) -> Session:
        """A session over `documents` (paths of files or directories, "-" for stdin, or documents
        already read) or over `text`; `settings`, or `options` for `self.settings(...)`."""
        if text is not None:
            documents = Document("text", text)
        elif isinstance(documents, (str, os.PathLike)):
            documents = read_context([os.fspath(documents)])
        elif not isinstance(documents, (Context, Document)):
            documents = read_context([os.fspath(p) for p in documents])
        if settings is None:
            settings = self.settings(**options)
        elif options:
            settings = dataclasses.replace(settings, **options)
        return Session(self.loaded, documents, settings)
