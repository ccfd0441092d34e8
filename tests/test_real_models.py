"""Real GGUF files end to end: they answer on the sample document, and their first 32 greedy
tokens equal llama.cpp's on the same file and prompt ids.

Run where the files are (`realmodel` marker; skipped elsewhere, so the default run stays
offline and fast):

    MSA_REAL_GGUF_DIR=/path/to/ggufs python -m pytest -m realmodel

The folder holds the files named in REAL_FILES (README, "Bring your own model", says where to
get them). The llama.cpp comparison also needs llama-cpp-python (tests/llamacpp_reference.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llamacpp_reference import REAL_GGUF_DIR, available, greedy_tokens

from msa.engine import Text, load
from msa.engine.prompt import build_prompt
from msa.models.attention_settings import AttentionSettings

REAL_FILES = {
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "qwen2": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}
DOCUMENT = Path(__file__).parent.parent / "examples" / "harbor-town.txt"
QUESTION = "Who was the first keeper of the lighthouse?"
ANSWER = "Tobias Wren"

pytestmark = [
    pytest.mark.realmodel,
    pytest.mark.skipif(REAL_GGUF_DIR is None, reason="MSA_REAL_GGUF_DIR names no folder"),
]


# auto: the default, int8 prefill inputs on AVX-512 VNNI, else bf16 tiles where the CPU has AMX
# or AVX-512 BF16; fp32: exact
@pytest.fixture(
    scope="module", params=[(f, d) for f in sorted(REAL_FILES) for d in ("fp32", "auto")]
)
def real(request, tmp_path_factory):
    family, dtype = request.param
    path = REAL_GGUF_DIR / REAL_FILES[family]
    if not path.is_file():
        pytest.skip(f"{path} is not there")
    return path, load(str(path), dtype=dtype, cache_dir=tmp_path_factory.mktemp("cache"))


def test_it_answers_on_the_sample_document(real):
    path, model = real
    session = model.session(str(DOCUMENT), max_tokens=48, prefix_cache=False)
    text = "".join(e.text for e in session.ask(QUESTION) if isinstance(e, Text))
    assert ANSWER in text, text


@pytest.mark.skipif(not available(), reason="llama-cpp-python is not installed")
def test_the_first_32_greedy_tokens_equal_llamacpp(real):
    """Under exact fp32 prefill (--dtype fp32) and int8 prefill inputs (auto on AVX-512 VNNI: as
    llama.cpp's); bf16 prefill parts from llama.cpp at the first near tie (README, Quantized
    weights): test_real_bf16_prefill.py bounds it instead."""
    path, model = real
    if model.loaded.prefill_products == "bf16":
        pytest.skip("bf16 prefill: greedy tokens follow llama.cpp's only to the first near tie")
    loaded = model.loaded
    prompt = build_prompt(loaded.tokenizer, DOCUMENT.read_text(), QUESTION)
    cache = loaded.model.new_cache(settings=AttentionSettings(mode="dense"))
    logits = loaded.model(torch.tensor(prompt.ids), cache)
    ours = []
    for _ in range(32):
        ours.append(int(logits.argmax()))
        logits = loaded.model(torch.tensor(ours[-1:]), cache)
    assert ours == greedy_tokens(path, prompt.ids, 32)
