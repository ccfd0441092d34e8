"""A quantized output head's top candidates come out in fp32, not bf16 (head_refine.py)."""

from __future__ import annotations

import pytest
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


@torch.no_grad()
def test_a_gguf_head_decodes_with_int8_inputs_and_refines_its_top_candidates():
    # one row (a decode step): the input quantized as llama.cpp does, then the top candidates
    # recomputed from the file's rows in fp32; several rows stay an fp32 product throughout
    pytest.importorskip("gguf")
    from test_kernels_ggml_blocks import random_weight

    from msa.kernels import ggml_blocks
    from msa.models.ggml_linear import GgmlLinear

    if ggml_blocks.compiled_extension() is None:
        pytest.skip(f"GGUF block kernels not built: {ggml_blocks.build_error()}")
    torch.manual_seed(0)
    # hidden 256: one Q6_K block a row (the real heads' type)
    config = ModelConfig.tiny(vocab_size=4096, hidden_size=256, tie_word_embeddings=False)
    model = Transformer(config).eval()
    blocks, _ = random_weight("Q6_K", config.vocab_size, config.hidden_size, seed=3)
    head = GgmlLinear(config.hidden_size, config.vocab_size)
    head.blocks, head.type_id = blocks, ggml_blocks.TYPES["Q6_K"]
    head.ggml_type = torch.tensor(head.type_id)
    model.lm_head = head

    x = torch.randn(1, config.hidden_size) * 4
    h = model.norm(x).float()
    exact = head.exact(h)  # [1, V]: the fp32 input times the file's rows
    assert (head(h) - exact).abs().max() > 1e-4  # int8 inputs: the refinement has work to do
    got = model.logits(x)
    top = exact.topk(8, dim=-1).indices  # well inside the 32 refined
    assert_close(got.gather(-1, top), exact.gather(-1, top), atol=1e-4, rtol=1e-5)
    assert torch.equal(got.argmax(-1), exact.argmax(-1))
    rest = torch.ones_like(got, dtype=torch.bool).scatter_(-1, head(h).topk(32).indices, False)
    assert torch.equal(got[rest], head(h)[rest])  # the others: the int8-input product's

    rows = torch.randn(5, config.hidden_size)
    assert torch.equal(model.logits(rows), head.exact(model.norm(rows).float()))
