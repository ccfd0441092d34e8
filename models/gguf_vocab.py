"""A `tokenizers` tokenizer, its special tokens and the prompt settings, from a GGUF file's
`tokenizer.*` metadata, giving the token ids llama.cpp gives on the same file.

Two vocabulary kinds (`tokenizer.ggml.model`):
- "llama": SentencePiece pieces with scores. llama.cpp tokenizes them by BPE over the scores:
  starting from characters, it merges the adjacent pair whose joined text is a token with the
  highest score, leftmost first. That is a `tokenizers` BPE with merges ranked by the joined
  token's score (gguf_spm_merges.py; not its Unigram model, which finds the best-scoring
  segmentation instead); characters that are no token fall back to <0xNN> bytes.
- "gpt2": byte-level BPE with the file's merges, after the text split `tokenizer.ggml.pre` names
  (gguf_pretokenizers.py).
Tokens the file marks control or user-defined are matched whole in the text first, as llama.cpp
does (its `tokenizer_st_partition`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
)

from .errors import ModelError
from .gguf_pretokenizers import PRE_TOKENIZERS
from .gguf_spm_merges import spm_merges

# GGUF token types (gguf.TokenType)
_UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 2, 3, 4, 6
_SPACE = "\u2581"  # SentencePiece's mark for a space

# Token texts that end generation in llama.cpp whatever the metadata says (its `special_eog_ids`),
# and those it takes as the end-of-turn token when the file names none (`special_eot_id`).
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
    # fill-in-the-middle pad, repository and file separators: llama.cpp stops on these too
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
)  # fmt: skip
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
)  # fmt: skip


@dataclass
class GgufVocab:
    """What the loader keeps of a GGUF file's tokenizer metadata."""

    tokenizer: Tokenizer
    chat_template: str  # "" when the file has none (a plain prompt is used then)
    bos_id: int | None
    add_bos: bool  # the prompt starts with the BOS token (llama.cpp's `add_bos`)
    stop_ids: list[int]  # EOS first, then the end-of-turn and other end-of-generation tokens

    def meta(self) -> dict:
        """The entries the converted copy's meta.json keeps (`eos_ids`: the stop ids)."""
        vocab = {i: t for t, i in self.tokenizer.get_vocab(with_added_tokens=True).items()}
        return {
            "chat_template": self.chat_template,
            "eos_ids": self.stop_ids,
            "add_bos": self.add_bos,
            "bos_token": vocab.get(self.bos_id, "") if self.bos_id is not None else "",
            "eos_token": vocab.get(self.stop_ids[0], "") if self.stop_ids else "",
        }


def vocab_from_metadata(fields: Mapping[str, object]) -> GgufVocab:
    """The vocabulary and prompt settings from `tokenizer.*` metadata (key -> decoded value)."""
    kind = fields.get("tokenizer.ggml.model")
    tokens = _list_of(fields, "tokens", str)
    if not tokens:
        raise ModelError("the GGUF file has no vocabulary (tokenizer.ggml.tokens)")
    types = _list_of(fields, "token_type", int) or [1] * len(tokens)
    scores = _list_of(fields, "scores", (int, float)) or [0.0] * len(tokens)
    if len(types) < len(tokens) or len(scores) < len(tokens):
        raise ModelError(
            f"the GGUF vocabulary has {len(tokens)} tokens but {len(types)} token types and "
            f"{len(scores)} scores"
        )
    if kind == "llama":
        prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
        tokenizer = sentencepiece_tokenizer(tokens, scores, types, add_space_prefix=prefix)
        default_bos, default_eos, default_add_bos = 1, 2, True
    elif kind == "gpt2":
        pre = str(fields.get("tokenizer.ggml.pre") or "default")
        merges = _list_of(fields, "merges", str)
        tokenizer = byte_level_tokenizer(tokens, merges, types, pre)
        default_bos = default_eos = 11
        default_add_bos = PRE_TOKENIZERS[pre].add_bos
    else:
        raise ModelError(
            f"GGUF tokenizer {kind!r} is not supported (supported: llama SentencePiece, "
            "gpt2 byte-level BPE)"
        )

    def token_id(key: str, default: int | None = None) -> int | None:
        value = fields.get(f"tokenizer.ggml.{key}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ModelError(f"GGUF tokenizer.ggml.{key} is {value!r}, not a token id")
        value = default if value is None else value
        return value if value is not None and 0 <= value < len(tokens) else None

    by_text = {t: i for i, t in enumerate(tokens)}
    eos = token_id("eos_token_id", default_eos)
    eot = token_id("eot_token_id")
    if eot is None:
        eot = next((by_text[t] for t in _EOT_TEXTS if t in by_text), None)
    stops = [eos, eot, token_id("eom_token_id")] + [by_text.get(t) for t in _EOG_TEXTS]
    stop_ids = list(dict.fromkeys(i for i in stops if i is not None))
    bos = token_id("bos_token_id", default_bos)
    add_bos = fields.get("tokenizer.ggml.add_bos_token")
    return GgufVocab(
        tokenizer=tokenizer,
        chat_template=str(fields.get("tokenizer.chat_template") or ""),
        bos_id=bos,
        add_bos=bool(default_add_bos if add_bos is None else add_bos) and bos is not None,
        stop_ids=stop_ids,
    )


def _list_of(fields: Mapping[str, object], key: str, kind) -> list:
    """`tokenizer.ggml.{key}`, a list of `kind` values ([] when absent)."""
    value = fields.get(f"tokenizer.ggml.{key}")
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(v, kind) and not isinstance(v, bool) for v in value
    ):
        raise ModelError(f"GGUF tokenizer.ggml.{key} is not a list of {_KIND_NAMES[kind]}")
    return value


_KIND_NAMES = {str: "strings", int: "whole numbers", (int, float): "numbers"}


def sentencepiece_tokenizer(
    tokens: list[str], scores: list[float], types: list[int], *, add_space_prefix: bool
) -> Tokenizer:
    """llama.cpp's SentencePiece tokenization (`llm_tokenizer_spm`) as a `tokenizers` BPE."""
    vocab = {t: i for i, t in enumerate(tokens)}
    matched_whole = (_UNKNOWN, _CONTROL, _USER_DEFINED)  # never inside the text the model sees
    merges = spm_merges(tokens, scores, {i for i, k in enumerate(types) if k not in matched_whole})
    unk = next((tokens[i] for i, k in enumerate(types) if k == _UNKNOWN), None)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, byte_fallback=True))
    # Spaces become the mark in each piece of text between whole-matched tokens; with the prefix,
    # each such piece starts with one more (sentencepiece's dummy prefix, even before a space,
    # where `Metaspace` would add none).
    spaces = [normalizers.Replace(" ", _SPACE)]
    tokenizer.normalizer = normalizers.Sequence(
        ([normalizers.Prepend(_SPACE)] if add_space_prefix else []) + spaces
    )
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    _add_whole_tokens(tokenizer, tokens, types)
    return tokenizer


def byte_level_tokenizer(
    tokens: list[str], merges: list[str], types: list[int], pre: str
) -> Tokenizer:
    """A byte-level BPE tokenizer (GPT-2's byte alphabet) splitting text as `pre` says."""
    if pre not in PRE_TOKENIZERS:
        raise ModelError(
            f"the model's tokenizer uses the pre-tokenizer {pre!r} (tokenizer.ggml.pre), "
            "which msa does not know"
        )
    shape = PRE_TOKENIZERS[pre]
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=pairs,
        ignore_merges=shape.ignore_merges,
    )
    tokenizer = Tokenizer(bpe)
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in shape.splits]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    _add_whole_tokens(tokenizer, tokens, types)
    return tokenizer


def _add_whole_tokens(tokenizer: Tokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens (<|im_end|>, <end_of_turn>) as special tokens, user-defined ones (Gemma's
    runs of spaces and newlines, <tool_call>) as plain added tokens: both matched whole in the text
    before the model splits the rest."""
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    )
    tokenizer.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, k in zip(tokens, types)
            if k in (_CONTROL, _UNKNOWN)
        ]
    )
