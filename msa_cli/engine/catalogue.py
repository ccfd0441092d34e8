"""The GGUF picks `msa models` offers, by size, and the memory each needs to read a document.

Each pick names a hub repository and quant type as `msa pull` takes them (`owner/repo:QUANT`),
with its file's size and the few numbers of its architecture that size its K/V cache. File
sizes are those the hub's file listings show (decimal, three significant digits: "4.92 GB"),
read from the repository pages named beside each entry; none is computed. Architectures and
trained context lengths are those of the models' own config.json files.

Memory to read N tokens (`memory_needed`): the GGUF file's bytes (msa maps the file and keeps a
Q4_K_M file's blocks as they are), plus the K/V cache at the default K/V dtype for N tokens
rounded up to whole blocks, plus MSA's block summaries (per layer, KV head and block: the keys'
per-channel min and max, fp32, in two frames). Working buffers of a prefill chunk and the
tokenizer are not counted: they do not grow with the document.
"""

from __future__ import annotations

from dataclasses import dataclass

SUMMARY_FRAMES = 2  # keys as stored and rotated back to position 0 (kv_cache.py)
SUMMARY_BYTES = 2 * 4  # min and max, fp32, per channel
LENGTHS = (32_768, 131_072)  # the lengths `msa models` shows memory at


@dataclass(frozen=True)
class Pick:
    spec: str  # owner/repo:QUANT, as `msa pull` takes it
    label: str
    file_bytes: int
    n_layers: int
    n_kv_heads: int
    head_dim: int
    trained_context: int


def _mb(n: float) -> int:
    return round(n * 1000**2)


def _gb(n: float) -> int:
    return round(n * 1000**3)


PICKS = (
    # huggingface.co/second-state/Qwen2.5-0.5B-Instruct-GGUF/tree/599ae81: 398 MB
    Pick("second-state/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", "Qwen2.5 0.5B Instruct",
         _mb(398), 24, 2, 64, 32_768),
    # huggingface.co/lmstudio-community/gemma-3-1b-it-GGUF/tree/main: 806 MB
    Pick("lmstudio-community/gemma-3-1b-it-GGUF:Q4_K_M", "Gemma 3 1B it",
         _mb(806), 26, 1, 256, 32_768),
    # huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF/blob/d52af37/...-Q4_K_M.gguf: 808 MB
    Pick("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", "Llama 3.2 1B Instruct",
         _mb(808), 16, 8, 64, 131_072),
    # huggingface.co/bartowski/Qwen2.5-1.5B-Instruct-GGUF/blob/8555385/...-Q4_K_M.gguf: 986 MB
    Pick("bartowski/Qwen2.5-1.5B-Instruct-GGUF:Q4_K_M", "Qwen2.5 1.5B Instruct",
         _mb(986), 28, 2, 128, 32_768),
    # huggingface.co/lmstudio-community/Qwen2.5-3B-Instruct-GGUF/tree/main: 1.93 GB
    Pick("lmstudio-community/Qwen2.5-3B-Instruct-GGUF:Q4_K_M", "Qwen2.5 3B Instruct",
         _gb(1.93), 36, 2, 128, 32_768),
    # huggingface.co/bartowski/Llama-3.2-3B-Instruct-GGUF/blob/c346bfc/...-Q4_K_M.gguf: 2.02 GB
    Pick("bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M", "Llama 3.2 3B Instruct",
         _gb(2.02), 28, 8, 128, 131_072),
    # huggingface.co/ggml-org/gemma-3-4b-it-GGUF/tree/main: 2.49 GB
    Pick("ggml-org/gemma-3-4b-it-GGUF:Q4_K_M", "Gemma 3 4B it",
         _gb(2.49), 34, 4, 256, 131_072),
    # bartowski/Qwen_Qwen3-4B-GGUF, its README's file table: 2.50GB
    Pick("bartowski/Qwen_Qwen3-4B-GGUF:Q4_K_M", "Qwen3 4B",
         _gb(2.50), 36, 8, 128, 32_768),
    # huggingface.co/lmstudio-community/Qwen2.5-7B-Instruct-GGUF/tree/2eecdd3: 4.68 GB
    Pick("lmstudio-community/Qwen2.5-7B-Instruct-GGUF:Q4_K_M", "Qwen2.5 7B Instruct",
         _gb(4.68), 28, 4, 128, 32_768),
    # huggingface.co/bartowski/Meta-Llama-3.1-8B-Instruct-GGUF/tree/4c506ee: 4.92 GB
    Pick("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M", "Llama 3.1 8B Instruct",
         _gb(4.92), 32, 8, 128, 131_072),
    # huggingface.co/lm-kit/gemma-3-12b-instruct-gguf/tree/main: 7.3 GB
    Pick("lm-kit/gemma-3-12b-instruct-gguf:Q4_K_M", "Gemma 3 12B it",
         _gb(7.30), 48, 8, 256, 131_072),
)  # fmt: skip


def memory_needed(
    *,
    weights_bytes: int,
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    n_tokens: int,
    kv_dtype: str | None = None,
    block_size: int | None = None,
) -> int:
    """Bytes a model needs to hold `n_tokens`: its weights, its K/V cache of `kv_dtype` (None: the
    default) rounded up to whole blocks of `block_size` (None: the default), and the blocks' key
    summaries that MSA selects blocks by."""
    import torch

    from msa.models.attention_settings import AttentionSettings
    from msa.models.config import ModelConfig
    from msa.models.kv_storage import kv_storage_dtype, row_scale_bytes

    kv_dtype = kv_dtype or AttentionSettings().kv_dtype
    block_size = block_size or ModelConfig.kv_block_size
    blocks = -(-n_tokens // block_size)
    row = head_dim * kv_storage_dtype(kv_dtype, torch.float32).itemsize
    row += row_scale_bytes(kv_dtype)
    kv = 2 * n_layers * n_kv_heads * blocks * block_size * row
    summaries = SUMMARY_FRAMES * n_layers * n_kv_heads * blocks * head_dim * SUMMARY_BYTES
    return weights_bytes + kv + summaries


def pick_memory(pick: Pick, n_tokens: int) -> int:
    """`memory_needed` for `pick` at `n_tokens`."""
    return memory_needed(
        weights_bytes=pick.file_bytes,
        n_layers=pick.n_layers,
        n_kv_heads=pick.n_kv_heads,
        head_dim=pick.head_dim,
        n_tokens=n_tokens,
    )


def longest_fit(pick: Pick, available: int) -> int | None:
    """The longest of LENGTHS at which `pick` fits in `available` bytes, or None."""
    fitting = [n for n in LENGTHS if pick_memory(pick, n) <= available]
    return max(fitting, default=None)


def largest_fitting(available: int, n_tokens: int) -> Pick | None:
    """The pick with the largest file whose memory at `n_tokens` fits in `available` bytes."""
    fitting = [p for p in PICKS if pick_memory(p, n_tokens) <= available]
    return max(fitting, key=lambda p: p.file_bytes, default=None)


def find_pick(spec: str) -> Pick | None:
    """The pick `spec` names (hub ids compare without regard to case, as the hub's do)."""
    return next((p for p in PICKS if p.spec.lower() == spec.lower()), None)
