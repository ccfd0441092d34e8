"""The prefix cache's memory of documents' token ids: same prompt as tokenizing, never trusted
when damaged."""

from __future__ import annotations

import os

from msa.engine.prefix_cache import tokens as token_files
from msa.engine.prefix_cache.tokens import TokenMemo
from msa.engine.prompt import build_prompt

QUESTION = "Who keeps the lighthouse?"


def _document(n_chars: int, seed: int = 0) -> str:
    words = ["keeper", "lamp", "tower", "storm", "1897", "Wren", "gull,", "tide.", "\n", "ship's"]
    out, i = [], seed
    while sum(len(w) + 1 for w in out) < n_chars:
        i = (i * 1103515245 + 12345) % 2**31
        out.append(words[i % len(words)])
    return " ".join(out)


def _memo_files(memo: TokenMemo) -> list:
    return (
        sorted(p for p in memo.dir.iterdir() if p.suffix == ".safetensors")
        if memo.dir.exists()
        else []
    )


def test_a_remembered_document_gives_the_same_prompt_as_tokenizing_it(embedded, tmp_path):
    tok, doc = embedded.tokenizer, _document(token_files.MIN_CHARS + 5000)
    memo = TokenMemo(tmp_path, tok.digest)
    fresh = build_prompt(tok, doc, QUESTION)
    first = build_prompt(tok, doc, QUESTION, token_memo=memo)
    assert len(_memo_files(memo)) == 1
    second = build_prompt(tok, doc, "Another question?", token_memo=memo)
    assert memo.ids(doc, lambda text: [])[1]  # remembered, not tokenized
    for got in (first, second):
        assert (got.head, got.document) == (fresh.head, fresh.document)
    assert list(second.document_offsets) == list(fresh.document_offsets)  # re-made on demand


def test_a_damaged_or_foreign_memo_is_tokenized_again(embedded, tmp_path):
    tok, doc = embedded.tokenizer, _document(token_files.MIN_CHARS + 100, seed=3)
    expected = tok.encode(doc)
    memo = TokenMemo(tmp_path, tok.digest)
    memo.ids(doc, tok.encode)
    path = _memo_files(memo)[0]
    data = bytearray(path.read_bytes())
    data[-8:] = bytes(8)  # flip the last ids
    path.write_bytes(bytes(data))
    assert memo.ids(doc, tok.encode) == (expected, False)
    assert memo.ids(doc, tok.encode) == (expected, True)  # written again, and sound
    path.write_bytes(path.read_bytes()[:100])  # truncated
    assert memo.ids(doc, tok.encode) == (expected, False)
    other = TokenMemo(tmp_path, "another tokenizer")  # never shared across tokenizers
    assert other.ids(doc, lambda text: [7]) == ([7], False)


def test_short_texts_read_only_caches_and_the_file_limit(tmp_path, monkeypatch):
    def count(text):
        return [len(text)]

    memo = TokenMemo(tmp_path, "tok")
    assert memo.ids("short", count) == ([5], False) and not _memo_files(memo)
    long_doc = _document(token_files.MIN_CHARS + 100)
    TokenMemo(tmp_path, "tok", read_only=True).ids(long_doc, count)
    assert not _memo_files(memo)
    monkeypatch.setattr(token_files, "MAX_FILES", 3)
    docs = [_document(token_files.MIN_CHARS + 100, seed=seed + 10) for seed in range(5)]
    for age, doc in enumerate(docs):
        before = set(_memo_files(memo))
        memo.ids(doc, count)
        (new,) = set(_memo_files(memo)) - before
        os.utime(new, (1e9 + age, 1e9 + age))  # file times tick coarsely: set them apart
    assert len(_memo_files(memo)) == 3
    assert [memo.ids(doc, count)[1] for doc in reversed(docs)] == [
        True,
        True,
        True,
        False,
        False,
    ]  # the newest stay
