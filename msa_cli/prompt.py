"""The prompt: the model's chat template, with the document first and the question last.

The document is tokenized on its own and the pieces' token ids are joined, so its tokens never
depend on the question: that is what lets a prefix cache reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass

from msa_models.errors import ModelError
from msa_models.tokenizer import TextTokenizer

_DOCUMENT_SLOT = "\u2063msa-document\u2063"
# The document sits between tags so the model sees where it ends and the question begins.
_USER_MESSAGE = (
    "Read this document, then answer the question after it.\n\n"
    "<document>\n{document}\n</document>\n\nQuestion: {question}"
)


@dataclass
class Prompt:
    head: list[int]       # template text before the document (system prompt, user turn start)
    document: list[int]
    tail: list[int]       # the question and the start of the assistant's turn

    @property
    def ids(self) -> list[int]:
        return self.head + self.document + self.tail

    @property
    def context_length(self) -> int:
        """Tokens that do not depend on the question."""
        return len(self.head) + len(self.document)


def build_prompt(tokenizer: TextTokenizer, document: str, question: str, *,
                 system: str | None = None) -> Prompt:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": _USER_MESSAGE.format(document=_DOCUMENT_SLOT, question=question.strip())})
    text = tokenizer.template.render(messages, add_generation_prompt=True)
    if text.count(_DOCUMENT_SLOT) != 1:
        raise ModelError("the model's chat template does not keep the user's message intact")
    head, tail = text.split(_DOCUMENT_SLOT)
    return Prompt(tokenizer.encode(head), tokenizer.encode(document), tokenizer.encode(tail))
