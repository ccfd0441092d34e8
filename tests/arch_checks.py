"""Shared by the architecture tests: tiny random Hugging Face checkpoints and the comparisons
of our model (prompt logits, cached decoding) against transformers' forward."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import assert_close, exact_kv
from tiny_checkpoints import CHAT_TEMPLATE, SPECIALS, tiny_vocab

VOCAB = 262  # len(tiny_vocab()[0])


def tiny_tokenizer_json() -> str:
    """A byte-level BPE tokenizer.json over the tiny vocabulary (no network, no real model)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, merges = tiny_vocab()
    tok = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split()) for m in merges]
        )
    )
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    return tok.to_str()


def randomize(
    model: torch.nn.Module, seed: int = 0, *, norm_mean: float = 1.0, std: float = 0.1
) -> None:
    """Weights of spread `std` (the init's 0.02 leaves logits flat and any bug invisible); norms
    around `norm_mean` (1 for Llama-style, 0 for Gemma-style weight+1); router biases too."""
    g = torch.Generator().manual_seed(seed)
    saved = model.state_dict()  # buffers that are not saved (Gemma's embed_scale) are constants
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if not t.is_floating_point() or "inv_freq" in name or name not in saved:
                continue
            noise = torch.randn(t.shape, generator=g) * std
            t.copy_(noise + (norm_mean if "norm" in name else 0.0))


def save_hf_dir(hf_model, folder: Path) -> Path:
    """`save_pretrained` plus a tokenizer, as a model directory on disk looks."""
    hf_model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(tiny_tokenizer_json())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>"})
    )
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return folder


def reference_logits(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def check_prompt_and_decode(
    model,
    ids: list[int],
    expected: torch.Tensor,
    *,
    n_prefill: int,
    atol: float,
    what: str,
    settings=None,
    prefill_chunk: int | None = None,
) -> None:
    """Our logits for the whole prompt, then prefill `n_prefill` tokens (in chunks of
    `prefill_chunk` if given) and decode the rest one at a time through the cache: every position
    must match transformers' full forward."""
    settings = exact_kv(settings)  # transformers' math, to fp32 rounding
    got = model(torch.tensor(ids), model.new_cache(settings=settings), all_logits=True)
    assert_close(got, expected, atol=atol, what=f"{what} prompt")
    cache = model.new_cache(settings=settings)
    chunk = prefill_chunk or n_prefill
    steps = [
        model(torch.tensor(ids[i : min(i + chunk, n_prefill)]), cache, all_logits=True)
        for i in range(0, n_prefill, chunk)
    ]
    for tok in ids[n_prefill:]:
        steps.append(model(torch.tensor([tok]), cache, all_logits=True))
    assert cache.length == len(ids)
    assert_close(torch.cat(steps), expected, atol=atol, what=f"{what} cached decode")
