"""Our model and tokenizer on the embedded GGUF against Hugging Face transformers on the same
file."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close, exact_kv

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Ünïcödé — 日本語のテキスト 🚀 café, naïve résumé.",
]
# No digit right after whitespace: transformers' GGUF tokenizer ignores the file's `smollm`
# pre-tokenizer (which isolates digits), and only there do the two splits differ.
TEXTS = [
    "Ünïcödé — 日本語のテキスト 🚀 emoji, café and naïve résumé; Ελληνικά, русский, عربى.",
    "def fib(n):\n\treturn n if n < 2 else fib(n-1) + fib(n-2)\n\n\nclass  A :\n    pass\r\n",
    "   leading spaces,\ttabs\t\tand\n\n\n\nnewlines   \u00a0 non-breaking\u2003em  ",
    "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
    "x=[a1,b22,c333];y={'k':'v'}  # comment\n",
]
WITH_DIGITS = ["Numbers: 12345 and  3.14159, 2024-11-30;\t42\n  7 items", "a  1\t\t2   3"]


def test_logits_match_transformers(embedded_fp32, hf_reference):
    hf_model, _ = hf_reference
    for text in PROMPTS:
        ids = embedded_fp32.tokenizer.encode(text)
        with torch.no_grad():
            expected = hf_model(torch.tensor([ids])).logits[0]
        actual = embedded_fp32.model(
            torch.tensor(ids), embedded_fp32.model.new_cache(settings=exact_kv()), all_logits=True
        )
        # both dequantize the same Q4_1/Q8_0 weights to fp32; observed max error ~5e-5 on logits
        # of ~30
        assert_close(actual, expected, atol=2e-3, rtol=1e-4, what=repr(text[:20]))
        assert torch.equal(actual.argmax(-1), expected.argmax(-1))


def test_default_int4_logits_near_transformers(embedded, hf_reference):
    """By default the Q4_1 weights compute as int4 with bf16 activations and an int8 output head:
    next-token distributions within a small KL of transformers' fp32 (observed <= 0.01 nats,
    greedy tokens the same at 82 of 83 positions)."""
    hf_model, _ = hf_reference
    assert embedded.weights == "int4"
    agree = total = 0
    for text in PROMPTS:
        ids = embedded.tokenizer.encode(text)
        with torch.no_grad():
            expected = hf_model(torch.tensor([ids])).logits[0].log_softmax(-1)
        actual = (
            embedded.model(
                torch.tensor(ids), embedded.model.new_cache(settings=exact_kv()), all_logits=True
            )
            .float()
            .log_softmax(-1)
        )
        kl = (expected.exp() * (expected - actual)).sum(-1)
        assert kl.max() < 0.05, (text[:20], kl.max())
        agree += int((actual.argmax(-1) == expected.argmax(-1)).sum())
        total += len(ids)
    assert agree >= 0.9 * total


def test_token_ids_match_transformers(embedded, hf_reference):
    _, hf_tok = hf_reference
    for text in TEXTS:
        assert (
            embedded.tokenizer.encode(text) == hf_tok(text, add_special_tokens=False)["input_ids"]
        ), text


def test_digits_split_as_the_published_smollm2_tokenizer(embedded, hf_reference):
    """SmolLM2's own tokenizer.json isolates digits before the byte-level split; apply that to
    transformers' tokenizer (built from the same GGUF vocabulary) and compare."""
    from tokenizers import pre_tokenizers

    _, hf_tok = hf_reference
    backend = hf_tok.backend_tokenizer
    saved = backend.pre_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    try:
        for text in WITH_DIGITS + TEXTS:
            assert (
                embedded.tokenizer.encode(text)
                == hf_tok(text, add_special_tokens=False)["input_ids"]
            ), text
    finally:
        backend.pre_tokenizer = saved


def test_streaming_decode_equals_full_decode(embedded):
    tok = embedded.tokenizer
    for text in TEXTS + WITH_DIGITS:
        ids = tok.encode(text)
        stream = tok.stream()
        assert "".join(stream.push(i) for i in ids) == tok.decode(ids)


def test_chat_template_is_the_files_own(embedded):
    text = embedded.tokenizer.template.render([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
        "trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
