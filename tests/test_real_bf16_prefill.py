"""Prefill on bf16 tiles (compute dtype "bf16", or "auto" on a CPU with AMX or AVX-512 BF16 but
no AVX-512 VNNI) and on int8 inputs ("auto" with AVX-512 VNNI) against
the exact fp32 path on the real Qwen2.5-Coder-0.5B Q4_K_M GGUF: every position's next-token
distribution over the sample document and question (712 tokens), by KL divergence and top-1
agreement. Measured: on AMX (fp32 output) mean KL 5.5e-5 (largest 1.7e-3), top-1 agreement
99.4%; on AVX-512 BF16 (oneDNN's GEMM, bf16 output) 1.05e-4 (2.4e-3), 99.6%; the bounds leave
room for other CPUs' summation order. llama.cpp's own logits on the same file are farther from
exact fp32 than the tiles'. Int8 inputs (Q8_K, as decode and llama.cpp) measured mean KL 8.6e-4
(largest 1.3e-2), top-1 98.7%: llama.cpp's distance. Greedy tokens against llama.cpp's are
checked in test_real_models.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llamacpp_reference import REAL_GGUF_DIR, available, prompt_logits

from msa.engine import load
from msa.engine.prompt import build_prompt
from msa.kernels import ggml_blocks
from msa.models.attention_settings import AttentionSettings

FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
DOCUMENT = Path(__file__).parent.parent / "examples" / "harbor-town.txt"

pytestmark = [
    pytest.mark.realmodel,
    pytest.mark.skipif(REAL_GGUF_DIR is None, reason="MSA_REAL_GGUF_DIR names no folder"),
]


def prefill_logits(path: Path, dtype: str, cache_dir: Path, kv_dtype: str = "fp16"):
    loaded = load(str(path), dtype=dtype, cache_dir=cache_dir).loaded
    prompt = build_prompt(
        loaded.tokenizer, DOCUMENT.read_text(), "Who was the first keeper of the lighthouse?"
    )
    cache = loaded.model.new_cache(settings=AttentionSettings(mode="dense", kv_dtype=kv_dtype))
    logits = loaded.model(torch.tensor(prompt.ids), cache, all_logits=True)
    return loaded, prompt.ids, logits.float().log_softmax(-1)  # [T, vocab]


def kl_from(exact: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(exact || other) at each position [T], from log-probabilities [T, vocab]."""
    return (exact.exp() * (exact - other)).sum(-1)


@pytest.fixture(scope="module")
def path():
    path = REAL_GGUF_DIR / FILE
    if not path.is_file():
        pytest.skip(f"{path} is not there")
    return path


@pytest.fixture
def bf16_fast():
    if not ggml_blocks.bf16_fast():
        pytest.skip("no fast bf16 products (AMX, AVX-512 BF16) here")


def test_bf16_prefill_stays_close_to_exact_fp32(path, tmp_path, bf16_fast):
    exact_model, _, exact = prefill_logits(path, "fp32", tmp_path)
    tiles_model, _, tiles = prefill_logits(path, "bf16", tmp_path)
    assert exact_model.prefill_products == "exact" and tiles_model.prefill_products == "bf16"
    assert exact_model.digest != tiles_model.digest  # their K/V are cached apart
    kl = kl_from(exact, tiles)
    agreement = (exact.argmax(-1) == tiles.argmax(-1)).float().mean().item()
    assert kl.mean().item() < 5e-4 and kl.max().item() < 2e-2, (kl.mean(), kl.max())
    assert agreement >= 0.98, agreement


@pytest.mark.skipif(not available(), reason="llama-cpp-python is not installed")
def test_bf16_prefill_is_closer_to_exact_fp32_than_llamacpp(path, tmp_path, bf16_fast):
    """What --dtype bf16 is for: llama.cpp's own logits on the same file and prompt (its products
    quantize their inputs to 8 bits) are farther from the exact fp32 ones than bf16 tiles are.
    Measured (fp32 K/V for all three): llama.cpp mean KL 1.1e-3, top-1 98.0%; bf16 1.0e-4,
    99.7% (gemma-3-270m: 5.1e-3 against 1.6e-4)."""
    _, ids, exact = prefill_logits(path, "fp32", tmp_path, kv_dtype="fp32")
    _, _, tiles = prefill_logits(path, "bf16", tmp_path, kv_dtype="fp32")
    theirs = torch.from_numpy(prompt_logits(path, ids, tmp_path / "logits.npy")).log_softmax(-1)
    assert kl_from(exact, tiles).mean() < kl_from(exact, theirs).mean()
    top = exact.argmax(-1)
    assert (tiles.argmax(-1) == top).float().mean() >= (theirs.argmax(-1) == top).float().mean()


def test_int8_prefill_stays_as_close_to_exact_fp32_as_decode(path, tmp_path):
    """auto on AVX-512 VNNI: each row's input in int8 as decode's one-row products quantize it.
    Measured over the sample: mean KL 8.6e-4 (largest 1.3e-2), top-1 98.7%; int8 inputs with
    their scales per 256, emulated in fp32 (benchmarks/int8_inputs.py), 8.8e-4: the kernel adds
    nothing of its own."""
    if not ggml_blocks.int8_fast():
        pytest.skip("auto prefills in int8 only with AVX-512 VNNI and no AMX")
    _, _, exact = prefill_logits(path, "fp32", tmp_path)
    int8_model, _, int8 = prefill_logits(path, "auto", tmp_path)
    assert int8_model.prefill_products == "int8"
    kl = kl_from(exact, int8)
    agreement = (exact.argmax(-1) == int8.argmax(-1)).float().mean().item()
    assert kl.mean().item() < 2e-3 and kl.max().item() < 5e-2, (kl.mean(), kl.max())
    assert agreement >= 0.97, agreement
