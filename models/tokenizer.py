"""Tokenizer and chat template: built from the model file's own data, never hand-written."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.sandbox
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from .errors import ModelError

# Pre-tokenizer splits named by GGUF's `tokenizer.ggml.pre`, as llama.cpp defines them.
_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    # SmolLM and StarCoder isolate every digit first, then split the GPT-2 way.
    "smollm": [r"\p{N}", _GPT2_SPLIT],
    "starcoder": [r"\p{N}", _GPT2_SPLIT],
    "gpt2": [_GPT2_SPLIT],
    "default": [_GPT2_SPLIT],
    "llama-bpe": [_LLAMA3_SPLIT],
    "llama3": [_LLAMA3_SPLIT],
    "qwen2": [_QWEN2_SPLIT],
}
_CONTROL = 3  # GGUF token type of special tokens such as <|im_end|>


def tokenizer_from_gguf_vocab(
    tokens: list[str], merges: list[str], token_types: list[int], pre: str
) -> Tokenizer:
    """A byte-level BPE tokenizer from the vocabulary arrays a GGUF file stores."""
    if pre not in _SPLITS:
        raise ModelError(
            f"the model's tokenizer uses the pre-tokenizer {pre!r}, which msa does not know"
        )
    vocab = {tok: i for i, tok in enumerate(tokens)}
    bpe = models.BPE(
        vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], ignore_merges=False
    )
    tok = Tokenizer(bpe)
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in _SPLITS[pre]]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, kind in zip(tokens, token_types) if kind == _CONTROL]
    tok.add_special_tokens(specials)
    return tok


@dataclass
class ChatTemplate:
    """The Jinja chat template stored with the model, rendered in a sandbox."""

    source: str
    bos_token: str = ""
    eos_token: str = ""

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message):
            raise ModelError(f"the model's chat template refused the prompt: {message}")

        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            template = env.from_string(self.source)
        except jinja2.TemplateError as e:
            raise ModelError(f"the model's chat template does not parse: {e}") from None
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )


class TextTokenizer:
    """Encode and decode text; special tokens such as <|im_start|> are parsed as themselves."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        eos_ids: list[int],
        *,
        digest: str | None = None,
    ):
        self.tokenizer = tokenizer
        self.template = template
        self.eos_ids = eos_ids
        self._digest = digest

    @classmethod
    def from_file(cls, path, template: ChatTemplate, eos_ids: list[int]) -> TextTokenizer:
        """From a tokenizer.json, with the digest of its bytes (hashing the file is ~20x faster
        than serializing the tokenizer again)."""
        data = Path(path).read_bytes()
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        return cls(tokenizer, template, eos_ids, digest=hashlib.sha256(data).hexdigest())

    @property
    def digest(self) -> str:
        """SHA-256 identifying this tokenizer (of its file, or of its JSON when built in memory)."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()
        return self._digest

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def stream(self) -> StreamingDecoder:
        return StreamingDecoder(self.tokenizer)

    def to_json(self) -> str:
        return self.tokenizer.to_str()


class StreamingDecoder:
    """Turns token ids into text one token at a time, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._stream = decoders.DecodeStream(skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        return self._stream.step(self._tokenizer, token_id) or ""
