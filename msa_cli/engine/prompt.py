"""The prompt: the model's chat template, with the document first and the question last (a
model without a template, a base model, gets the same messages as plain text: ChatTemplate).

The document is tokenized on its own and the pieces' token ids are joined, so its tokens never
depend on the question: that is what lets a prefix cache reuse them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from msa.models.errors import InputError, ModelError
from msa.models.template_parts import Part
from msa.models.tokenizer import TextTokenizer

if TYPE_CHECKING:
    from .prefix_cache.tokens import TokenMemo

# The document sits between tags so the model sees where it ends and the question begins.
_USER_MESSAGE = (
    "Read this document, then answer the question after it.\n\n"
    "<document>\n{document}\n</document>\n\nQuestion: {question}"
)
_BEFORE_DOCUMENT, _BETWEEN = _USER_MESSAGE.removesuffix("{question}").split("{document}")


@dataclass
class Prompt:
    head: list[int]  # template text before the document (system prompt, user turn start)
    document: list[int]
    tail: list[int]  # the question and the start of the assistant's turn
    # (start, end) character offsets in the document text of each document token, for sources
    document_offsets: Sequence[tuple[int, int]] = field(default_factory=list, repr=False)
    question_at: int = (
        0  # tail[:question_at] is template text before the question (sources' baseline)
    )

    @property
    def ids(self) -> list[int]:
        return self.head + self.document + self.tail

    @property
    def context_length(self) -> int:
        """Tokens that do not depend on the question."""
        return len(self.head) + len(self.document)


def user_message(document: str, question: str) -> str:
    """The first user message: the document, then the question. A server is sent this text too."""
    return _USER_MESSAGE.format(document=document, question=question.strip())


def split_user_message(content: str) -> tuple[str, str] | None:
    """(document, question) of a message `user_message` made; None for any other text."""
    if not content.startswith(_BEFORE_DOCUMENT):
        return None
    document, between, question = content[len(_BEFORE_DOCUMENT) :].rpartition(_BETWEEN)
    return (document, question) if between else None


def build_prompt(
    tokenizer: TextTokenizer,
    document: str,
    question: str,
    *,
    system: str | None = None,
    token_memo: TokenMemo | None = None,
) -> Prompt:
    """The prompt asking `question` about `document`; its ids come from `token_memo` (the prefix
    cache's) when it remembers them."""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": _user_parts(document, question)})
    return _around_document(tokenizer, messages, token_memo)


def _user_parts(document: str, question: str) -> list[Part]:
    """`user_message(document, question)` in parts: the document and the question tagged."""
    return [
        Part(_BEFORE_DOCUMENT),
        Part(document, tag="document"),
        Part(_BETWEEN),
        Part(question.strip(), tag="question"),
    ]


def prompt_from_messages(tokenizer: TextTokenizer, messages: list[dict]) -> Prompt:
    """The prompt for a conversation of {"role", "content"} messages ending with the user's.

    When the first user message carries a document (`user_message`'s text, as `msa ask` and
    `msa chat --server` send it), the document is tokenized on its own, as `build_prompt` does:
    the same tokens, so a server shares the prefix cache with `msa ask`. Otherwise the context
    is everything before the last user message.
    """
    messages = [dict(m) for m in messages]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise InputError("a conversation needs a user message")
    last = messages[users[-1]]
    carried = split_user_message(messages[users[0]]["content"])
    question = carried[1] if carried is not None and len(users) == 1 else last["content"]
    if not question.strip():  # the model would answer a question of its own invention
        raise InputError("the question is empty")
    if carried is not None:
        messages[users[0]]["content"] = _user_parts(*carried)
        if len(users) > 1:
            last["content"] = [Part(last["content"], tag="question")]
    else:
        last["content"] = [Part("", tag="document"), Part(last["content"], tag="question")]
    return _around_document(tokenizer, messages)


def _around_document(
    tokenizer: TextTokenizer, messages: list[dict], token_memo: TokenMemo | None = None
) -> Prompt:
    """Render `messages` (one of which holds the document part) and tokenize the document on its
    own; the messages' text is read as plain text, never as special tokens."""
    parts = tokenizer.template.render_parts(messages)
    at = [i for i, part in enumerate(parts) if part.tag == "document"]
    if len(at) != 1:
        raise ModelError("the model's chat template does not keep the user's message intact")
    head, document, tail = parts[: at[0]], parts[at[0]].text, parts[at[0] + 1 :]
    encoding = None  # stays None when the token memo knew the ids

    def tokenize(text: str) -> list[int]:
        nonlocal encoding
        encoding = tokenizer.encode_text(text)
        return list(encoding.ids)

    ids = token_memo.ids(document, tokenize)[0] if token_memo is not None else tokenize(document)
    offsets = _OffsetsOnDemand(tokenizer, document) if encoding is None else list(encoding.offsets)
    tail_ids = tokenizer.encode_parts(tail)
    return Prompt(
        tokenizer.encode_parts(head),
        ids,
        tail_ids,
        document_offsets=offsets,
        question_at=_tokens_before_question(tokenizer, tail, tail_ids),
    )


class _OffsetsOnDemand(Sequence):
    """A document's token offsets, found by tokenizing it again on first use (its ids came from
    the token memo, and only `--sources` reads offsets)."""

    def __init__(self, tokenizer: TextTokenizer, document: str):
        self._tokenizer, self._document, self._offsets = tokenizer, document, None

    def _all(self) -> list[tuple[int, int]]:
        if self._offsets is None:
            self._offsets = list(self._tokenizer.encode_text(self._document).offsets)
        return self._offsets

    def __getitem__(self, i):
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())


def _tokens_before_question(tokenizer: TextTokenizer, parts: list[Part], ids: list[int]) -> int:
    """How many of `ids` (the tokens of `parts`) come before the last part tagged "question"."""
    tagged = [i for i, part in enumerate(parts) if part.tag == "question"]
    at = tagged[-1] if tagged else None  # a conversation's last question
    if at is None or not parts[at].text:
        return 0
    before = parts[:at]
    while before and not before[-1].text.rstrip():
        before.pop()
    if not before:
        return 0
    before[-1] = Part(before[-1].text.rstrip(), template=before[-1].template)
    before_ids = tokenizer.encode_parts(before)
    return len(before_ids) if ids[: len(before_ids)] == before_ids else 0


def next_turn(
    tokenizer: TextTokenizer, question: str, *, system: str | None = None
) -> tuple[list[int], int]:
    """Token ids that close the assistant's answer and ask `question` in a new user turn (a
    chat's turns after the first): the template's own text between an answer and the next one;
    and how many of them come before the question."""
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {"role": "user", "content": "..."},
        {"role": "assistant", "content": [Part("", tag="answer")]},
        {"role": "user", "content": [Part(question.strip(), tag="question")]},
    ]
    parts = tokenizer.template.render_parts(messages)
    at = [i for i, part in enumerate(parts) if part.tag == "answer"]
    if len(at) != 1:
        raise ModelError("the model's chat template does not keep the assistant's message intact")
    turn = parts[at[0] + 1 :]
    ids = tokenizer.encode_parts(turn)
    return ids, _tokens_before_question(tokenizer, turn, ids)
