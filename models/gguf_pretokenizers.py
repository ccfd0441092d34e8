"""The text splits of byte-level BPE vocabularies, by the name GGUF's `tokenizer.ggml.pre` gives.

The patterns are the ones llama.cpp splits with (src/llama-vocab.cpp, `llm_tokenizer_bpe`): data
that must be the same for the ids to be the same. llama.cpp applies each regex in turn to the
pieces the previous one left, keeping both the matches and the text between them: what a
`tokenizers` Split with behavior "isolated" does. Names whose split llama.cpp writes as custom C++
code (kimi-k2, afmoe, superbpe, gemma4, ...) are not here, so they are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_JAIS2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
    r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
_DEEPSEEK_LATIN = (
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕ"
    r"ἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯ"
    r"ꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"
)
_DEEPSEEK3_WORDS = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER_THEN_LOWER = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+{s}"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*{s}"
)
_TEKKEN = (
    _UPPER_THEN_LOWER.replace("{s}", "")
    + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    _UPPER_THEN_LOWER.replace("{s}", _CONTRACTIONS + "?")
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"


@dataclass(frozen=True)
class PreTokenizer:
    splits: tuple[str, ...]
    ignore_merges: bool = False  # a piece that is itself a token is taken whole (llama.cpp's flag)
    add_bos: bool = False  # llama.cpp's default when the file has no tokenizer.ggml.add_bos_token


_SHAPES = {
    "llama3": PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True),
    "dbrx": PreTokenizer((_LLAMA3,)),
    "jais-2": PreTokenizer((_JAIS2,)),
    "deepseek-llm": PreTokenizer(
        (
            r"[\r\n]",
            _DEEPSEEK_LATIN,
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}+",
        )
    ),
    "deepseek-v3": PreTokenizer((r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3_WORDS)),
    "deepseek-coder": PreTokenizer(
        (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}")
    ),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    "starcoder": PreTokenizer((r"\p{N}", _GPT2)),
    "gpt2": PreTokenizer((_GPT2,)),
    "qwen2": PreTokenizer((_QWEN2,)),
    "qwen35": PreTokenizer((_QWEN35,)),
    "bloom": PreTokenizer((_BLOOM,)),
    "viking": PreTokenizer((_BLOOM, r"\p{N}")),
    "tekken": PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
    "chameleon": PreTokenizer(
        (
            r"<sentinel:[0-9]+>",
            r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            r"([\t\n]|    |  )",
            r"\p{N}",
            r"[\p{P}!-/:-@\[-`{-~]",
            _GPT2,
        ),
        add_bos=True,
    ),
    "gpt-4o": PreTokenizer((_GPT4O,)),
    "seed-coder": PreTokenizer(
        (
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+",
        )
    ),
    "bailingmoe": PreTokenizer(
        (
            r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
        )
    ),
    "exaone-moe": PreTokenizer(
        (
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
        )
    ),
    "minicpm5": PreTokenizer(
        (
            r"\p{N}{1,3}",
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        ignore_merges=True,
    ),
    "ufakzeka": PreTokenizer(
        (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
    ),
    "laguna": PreTokenizer((r"[^\n]+|[\n]+", _QWEN2)),
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
}

# Each name llama.cpp reads from `tokenizer.ggml.pre`, and the split it stands for.
_NAMES = {
    "llama3": [
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "jina-v5-nano",
    ],
    "dbrx": ["smaug-bpe", "chatglm-bpe", "glm4"],
    "starcoder": ["refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"],
    "gpt2": [
        "gpt-2",
        "phi-2",
        "jina-es",
        "jina-de",
        "gigachat",
        "jina-v2-es",
        "jina-v2-de",
        "a.x-4.0",
        "mellum",
        "modern-bert",
        "jina-v1-en",
        "jina-v2-code",
        "roberta-bpe",
        "exaone4",
        "mpt",
        "olmo",
        "jais",
        "trillion",
        "granite-docling",
    ],
    "qwen2": [
        "deepseek-r1-qwen",
        "kormo",
        "f2llmv2",
        "megrez",
        "stablelm2",
        "hunyuan",
        "solar-open",
        "grok-2",
    ],
    "deepseek-v3": ["hunyuan-dense", "joyai-llm", "hy_v4"],
    "bloom": ["poro-chat", "gpt3-finnish"],
    "gpt-4o": ["llama4", "kanana2", "talkie", "minimax-m2"],
    "bailingmoe": ["bailingmoe2", "llada-moe"],
}
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_SHAPES,
    **{alias: _SHAPES[shape] for shape, aliases in _NAMES.items() for alias in aliases},
}
