"""Our tokenizers of the real GGUF files against llama.cpp's (llama-cpp-python, where it can be
imported; else transformers' reading of the same file), on a text of every kind. Runs where
MSA_REAL_GGUF_DIR names a folder holding the files."""

from __future__ import annotations

import functools
from pathlib import Path

import llamacpp_reference
import pytest

from msa.models.gguf_header import read_header
from msa.models.gguf_loader import _tokenizer_from_metadata

# read at import: the per-test home clears MSA_* variables
REAL_DIR = llamacpp_reference.REAL_GGUF_DIR
GEMMA = "gemma-3-270m-q4_k_m.gguf"
QWEN = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

pytestmark = [
    pytest.mark.realmodel,
    pytest.mark.skipif(not REAL_DIR, reason="MSA_REAL_GGUF_DIR names no folder of real GGUFs"),
]

MIXED = (
    "The quick brown fox jumps over the lazy dog. It's 2024-06-01; we'll pay $1,234.56 (12%).\n"
    "def fib(n):\n    if n < 2:\n        return n\n"
    "\treturn fib(n - 1) + fib(n-2)  # recursion\n\n\n"
    "    indented   spaces    and\ttabs\t\there\r\n"
    "中文测试：你好，世界！日本語のテキスト。한국어 텍스트.\n"
    "Emoji: 😀👍🏽🇫🇷 ❤️ — “quotes” and ‘apostrophes’… naïve café Ünïcödé\n"
    "Numbers: 3.14159 1000000 0x1F 1e-9 and 12345678901234567890.\n"
    '<b>html</b> <div class="x">a&amp;b</div> \u00a0nbsp   trailing   \n'
    "  leading spaces, CamelCaseWords, snake_case_names, URLs: https://example.com/a?b=c&d=e\n"
)


def reference_ids(path: Path, texts: list[str]) -> list[list[int]]:
    """The ids of each text by llama.cpp (llamacpp_reference.py), else by transformers."""
    if llamacpp_reference.available():
        return llamacpp_reference.token_ids(path, texts)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return [hf.encode(text, add_special_tokens=False) for text in texts]


@functools.cache
def converted(name: str):
    from tokenizers import Tokenizer

    path = Path(REAL_DIR) / name
    if not path.is_file():
        pytest.skip(f"{path} is not there")
    tokenizer_json, meta = _tokenizer_from_metadata(read_header(path))
    return path, Tokenizer.from_str(tokenizer_json), meta


@pytest.mark.parametrize("name", [GEMMA, QWEN])
def test_ids_equal_the_reference(name):
    path, tokenizer, _ = converted(name)
    texts = [MIXED, *MIXED.splitlines(keepends=True)]
    for text, expected in zip(texts, reference_ids(path, texts)):
        assert tokenizer.encode(text, add_special_tokens=False).ids == expected, text
    assert tokenizer.decode(tokenizer.encode(MIXED, add_special_tokens=False).ids) == MIXED


def test_prompt_settings():
    _, _, gemma = converted(GEMMA)
    # a base model: no template, so a plain prompt; <bos> first; stops on <eos> and on
    # <end_of_turn>, found by its text as llama.cpp finds it
    assert (gemma["chat_template"], gemma["add_bos"], gemma["bos_token"]) == ("", True, "<bos>")
    assert gemma["eos_ids"][:2] == [1, 106]
    # the whole set is llama.cpp's end-of-generation set (llama_vocab_is_eog, llama-cpp-python
    # 0.3.36), "</s>" (212, Gemma's HTML strikethrough end) included as llama.cpp includes it
    assert sorted(gemma["eos_ids"]) == [1, 106, 212]
    _, _, qwen = converted(QWEN)
    assert qwen["chat_template"].startswith("{%- if tools %}")
    assert (qwen["add_bos"], qwen["eos_token"]) == (False, "<|im_end|>")
    assert qwen["eos_ids"][:2] == [151645, 151643]  # <|im_end|>, then <|endoftext|>
    assert sorted(qwen["eos_ids"]) == [128247, 151643, 151645, 151662, 151663, 151664]
