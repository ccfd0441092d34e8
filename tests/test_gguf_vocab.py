"""Tokenizers from GGUF metadata (models/gguf_vocab.py) on tiny vocabularies written by the `gguf`
package: ids worked out by hand from llama.cpp's rules, and equal to transformers' conversion of
the same file where the two agree."""

from __future__ import annotations

import pytest

from msa.engine.prompt import build_prompt
from msa.models.errors import ModelError
from msa.models.gguf_header import read_header
from msa.models.gguf_vocab import vocab_from_metadata
from msa.models.tokenizer import ChatTemplate, StreamingDecoder, TextTokenizer

BYTES = [f"<0x{b:02X}>" for b in range(256)]
# ids 259.. (after <unk>, <s>, </s> and the 256 bytes), with their scores
SPM_PIECES = ["\u2581", "a", "b", "c", "\u2581a", "ab", "bc", "abc", "\u2581ab"]
SPM_SCORES = [-6.0, -7.0, -8.0, -9.0, -2.0, -3.0, -1.0, -5.0, -4.0]
# 268 a control token, 269 a user-defined one (both matched whole)
SPM_PIECES += ["<end_of_turn>", "<br>"]
SPM_SCORES += [0.0, 0.0]
SPM_TOKENS = ["<unk>", "<s>", "</s>"] + BYTES + SPM_PIECES
SPM_TYPES = [2, 3, 3] + [6] * 256 + [1] * 9 + [3, 4]


def write_vocab_gguf(path, model: str, tokens, types, **extra) -> None:
    """A GGUF holding only a vocabulary (and the few llama keys transformers wants)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in [("block_count", 1), ("context_length", 64), ("embedding_length", 8)]:
        w.add_uint32(f"llama.{key}", value)
    w.add_uint32("llama.feed_forward_length", 8)
    w.add_uint32("llama.attention.head_count", 1)
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types(types)
    for name, value in extra.items():
        getattr(w, f"add_{name}")(value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_vocab(path):
    fields = read_header(path).fields
    return vocab_from_metadata({k: v for k, v in fields.items() if k.startswith("tokenizer.")})


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "spm.gguf"
    write_vocab_gguf(
        path, "llama", SPM_TOKENS, SPM_TYPES, token_scores=[0.0] * 259 + SPM_SCORES, bos_token_id=1,
        eos_token_id=2, add_bos_token=True, add_space_prefix=True,
    )  # fmt: skip
    return path


def encode(vocab, text: str) -> list[int]:
    return vocab.tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(
    "text, ids",
    [
        # "▁abc": "bc" scores best (-1), then "▁a" (-2); "▁abc" is no token
        ("abc", [263, 265]),
        # "▁ab" (-4) after "▁a"; "\n" is no piece: its byte <0x0A> (3 + 10)
        ("ab\nc", [267, 13, 262]),
        # "€" is no piece: its three UTF-8 bytes
        ("a\u20acb", [263, 229, 133, 175, 261]),
        # sentencepiece's prefix comes on top of a leading space
        (" abc", [259, 263, 265]),
        # whole-matched tokens; the text after each gets the prefix again
        ("abcbc<br>abc", [263, 265, 265, 269, 263, 265]),
        ("<s>abc</s> abc<end_of_turn>", [1, 263, 265, 2, 259, 263, 265, 268]),
    ],
)
def test_sentencepiece_ids_by_hand(spm_file, text, ids):
    assert encode(read_vocab(spm_file), text) == ids


def test_sentencepiece_streams_the_text_back(spm_file):
    """Byte pieces held back until their character is whole; the prefix space not shown."""
    vocab = read_vocab(spm_file)
    for text in ["a\u20acb abc", " abc", "ab\nc"]:
        stream = StreamingDecoder(vocab.tokenizer)
        assert "".join(stream.push(i) for i in encode(vocab, text)) == text


def test_sentencepiece_matches_transformers(spm_file):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(spm_file.parent, gguf_file=spm_file.name)
    vocab = read_vocab(spm_file)
    # transformers adds the prefix to the text's first piece only, so no text here starts with
    # a space or holds an added token
    for text in ["abc abc", "a\u20acb", "bcabc  a", "ab\nc cab", "cba\tabcabc \u00e9"]:
        assert encode(vocab, text) == reference.encode(text, add_special_tokens=False), text
        assert vocab.tokenizer.decode(encode(vocab, text)) == text


def test_sentencepiece_prompt_settings(spm_file):
    vocab = read_vocab(spm_file)
    # no eot id in the file: <end_of_turn> found by its text, as llama.cpp does
    assert vocab.stop_ids == [2, 268]
    assert vocab.meta() == {
        "chat_template": "",
        "eos_ids": [2, 268],
        "add_bos": True,
        "bos_token": "<s>",
        "eos_token": "</s>",
    }


def byte_level_tokens():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    merges = ["\u0120 a", "1 2", "12 3", "\u0120 1", "\u01201 2"]
    tokens = alphabet + [m.replace(" ", "") for m in merges] + ["<|im_end|>"]
    return tokens, merges, [1] * (len(tokens) - 1) + [3]


@pytest.fixture(scope="module")
def bpe_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    tokens, merges, types = byte_level_tokens()
    for pre in ["gpt-2", "qwen2", "llama-bpe"]:
        write_vocab_gguf(
            folder / f"{pre}.gguf", "gpt2", tokens, types, token_merges=merges,
            tokenizer_pre=pre, eos_token_id=len(tokens) - 1,
        )  # fmt: skip
    return folder


BPE_TEXT = "a 123 4567\n\n  b's<|im_end|> \u4e2d\u6587 \U0001f600  \t x1234\n"


@pytest.mark.parametrize("pre", ["gpt-2", "qwen2", "llama-bpe"])
def test_byte_level_matches_transformers(bpe_files, pre):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(bpe_files, gguf_file=f"{pre}.gguf")
    vocab = read_vocab(bpe_files / f"{pre}.gguf")
    ids = encode(vocab, BPE_TEXT)
    assert ids == reference.encode(BPE_TEXT, add_special_tokens=False)
    assert vocab.tokenizer.decode(ids, skip_special_tokens=False) == BPE_TEXT


def test_byte_level_splits_digits_as_named(bpe_files):
    tokens, _, _ = byte_level_tokens()
    pieces = {
        pre: [tokens[i] for i in encode(read_vocab(bpe_files / f"{pre}.gguf"), " 1234")]
        for pre in ["gpt-2", "qwen2", "llama-bpe"]
    }
    assert pieces == {
        "gpt-2": ["\u0120", "123", "4"],  # " 1234" one piece; "1 2" ranks before "Ġ 1"
        "qwen2": ["\u0120", "1", "2", "3", "4"],  # every digit alone
        "llama-bpe": ["\u0120", "123", "4"],  # digits in threes
    }
    # with no add_bos_token in the file, llama.cpp adds BOS for llama-bpe only (and with no
    # bos id, its default 11); the file names <|im_end|> the EOS
    llama3, qwen2 = (read_vocab(bpe_files / f"{pre}.gguf") for pre in ["llama-bpe", "qwen2"])
    assert (llama3.add_bos, llama3.bos_id, qwen2.add_bos) == (True, 11, False)
    assert qwen2.stop_ids == [len(tokens) - 1]


def test_unknown_pre_tokenizer_is_refused(tmp_path):
    tokens, merges, types = byte_level_tokens()
    write_vocab_gguf(
        tmp_path / "x.gguf", "gpt2", tokens, types, token_merges=merges, tokenizer_pre="klingon"
    )
    with pytest.raises(ModelError, match="pre-tokenizer 'klingon'") as e:
        read_vocab(tmp_path / "x.gguf")
    assert "\n" not in str(e.value)


def test_unknown_vocabulary_kind_is_refused(tmp_path):
    write_vocab_gguf(tmp_path / "x.gguf", "t5", ["a"], [1])
    with pytest.raises(ModelError, match="GGUF tokenizer 't5' is not supported"):
        read_vocab(tmp_path / "x.gguf")


def test_bos_starts_the_prompt_once():
    message = [{"role": "user", "content": "Hi"}]
    plain = ChatTemplate("{{ messages[0]['content'] }}", bos_token="<s>", add_bos=True)
    assert plain.render(message) == "<s>Hi"
    own = ChatTemplate("{{ bos_token }}{{ messages[0]['content'] }}", bos_token="<s>", add_bos=True)
    assert own.render(message) == "<s>Hi"
    assert ChatTemplate("{{ messages[0]['content'] }}", bos_token="<s>").render(message) == "Hi"


def test_base_model_gets_a_plain_prompt(spm_file):
    vocab = read_vocab(spm_file)
    template = ChatTemplate.from_meta(vocab.meta())
    tok = TextTokenizer(vocab.tokenizer, template, vocab.stop_ids)
    assert template.form.startswith("a plain document-then-question prompt")
    assert template.render([{"role": "user", "content": "Q"}]) == "<s>Q\n\nAnswer:"
    prompt = build_prompt(tok, "abc abc", "cab?")
    assert prompt.head[0] == 1  # BOS
    assert prompt.document == tok.encode("abc abc")  # tokenized on its own
    text = tok.decode(prompt.ids)
    assert text.endswith("Question: cab?\n\nAnswer:"), text
