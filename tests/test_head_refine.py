"""A quantized output head's top candidates come out in fp32, not bf16 (head_refine.py)."""

from __future__ import annotations

import torch
from conftest import assert_close

from msa.models.config import ModelConfig
from msa.models.llama import Transformer
from msa.models.quantize import quantize_model


def test_the_top_candidates_equal_the_fp32_product_of_the_int8_rows():
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=4096, tie_word_embeddings=False)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 1.0)  # logits around 10-30: bf16 steps of 0.06-0.125
    quantize_model(model, "int8")
    head = model.lm_head
    x = torch.randn(5, config.hidden_size)
    h = model.norm(x)
    exact = h @ (head.weight.float() * head.scales[:, None].float()).T  # [5, V] fp32
    coarse = head(h)  # bf16 products, as the kernel gives them
    assert (coarse - exact).abs().max() > 1e-3  # so the refinement has something to do

    got = model.logits(x)
    top = exact.topk(8, dim=-1).indices  # well inside the 32 refined
    assert_close(got.gather(-1, top), exact.gather(-1, top), atol=1e-4, rtol=1e-5)
    assert torch.equal(got.argmax(-1), exact.argmax(-1))
