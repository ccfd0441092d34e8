"""Tokenizer and chat template: built from the model file's own data, never hand-written."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.sandbox
from tokenizers import Tokenizer, decoders

from .errors import ModelError
from .template_parts import Part, render_parts

# The prompt of a model without a chat template (a base model): its messages one after the other,
# each answer after "Answer:", which also cues the next one.
_PLAIN_ANSWER = "Answer:"


@dataclass
class ChatTemplate:
    """The Jinja chat template stored with the model, rendered in a sandbox; with no template
    (`source` empty: a base model), a plain prompt of the messages in turn."""

    source: str
    bos_token: str = ""
    eos_token: str = ""
    add_bos: bool = False  # the text starts with `bos_token` even where the template omits it

    @classmethod
    def from_meta(cls, meta: dict) -> ChatTemplate:
        """From the entries `to_meta` wrote into a converted copy's meta.json."""
        return cls(
            meta["chat_template"],
            bos_token=meta.get("bos_token", ""),
            eos_token=meta.get("eos_token", ""),
            add_bos=meta.get("add_bos", False),
        )

    def to_meta(self) -> dict:
        return {
            "chat_template": self.source,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_bos": self.add_bos,
        }

    @property
    def form(self) -> str:
        """Which prompt the model gets, in words (for --verbose)."""
        if self.source:
            return "the model's chat template"
        return "a plain document-then-question prompt (the model has no chat template)"

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt's text, messages' text included (their `content` strings)."""
        if self.source:
            text = self._render_template(messages, add_generation_prompt)
        else:
            text = _plain_prompt(messages, add_generation_prompt)
        if self.add_bos and self.bos_token and not text.startswith(self.bos_token):
            text = self.bos_token + text  # llama.cpp adds it the same way (Gemma needs <bos>)
        return text

    def _render_template(self, messages: list[dict], add_generation_prompt: bool) -> str:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message):
            raise ModelError(f"the model's chat template refused the prompt: {message}")

        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            template = env.from_string(self.source)
        except jinja2.TemplateError as e:
            raise ModelError(f"the model's chat template does not parse: {e}") from None
        try:
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except jinja2.TemplateError as e:  # SecurityError (the sandbox), UndefinedError, ...
            raise ModelError(
                f"the model's chat template failed on these messages ({type(e).__name__}: {e})"
            ) from None

    def render_parts(self, messages: list[dict], add_generation_prompt: bool = True) -> list[Part]:
        """The prompt as the template's own text and the messages' text, apart (`template_parts`):
        a message's `content` is a string or a list of `Part`s."""
        return render_parts(lambda m: self.render(m, add_generation_prompt), messages)


def _plain_prompt(messages: list[dict], add_generation_prompt: bool) -> str:
    turns = [
        f"{_PLAIN_ANSWER} {m['content']}\n\n" if m["role"] == "assistant" else f"{m['content']}\n\n"
        for m in messages
    ]
    return "".join(turns) + (_PLAIN_ANSWER if add_generation_prompt else "")


class TextTokenizer:
    """Encode and decode text. `encode` reads special tokens such as <|im_start|> as themselves
    (for the template's own text); `encode_text` reads them as plain characters (for text from
    documents and messages, which must never open or close a turn)."""

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
        self._special_ids: set[int] | None = None
        # `encode_special_tokens` is a setting of the one Tokenizer object (a copy takes ~2 s for
        # a 262K vocabulary): encodes that change it hold this lock, so threads never mix modes
        self._mode = threading.Lock()

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
        """Template text: special tokens in it are read as such."""
        with self._mode:
            return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_text(self, text: str):
        """Document or message text: the `tokenizers` Encoding (ids and offsets), with special
        tokens' strings read as the plain characters they are."""
        with self._mode:
            self.tokenizer.encode_special_tokens = True
            try:
                return self.tokenizer.encode(text, add_special_tokens=False)
            finally:
                self.tokenizer.encode_special_tokens = False

    def encode_parts(self, parts: list[Part]) -> list[int]:
        """Token ids of a prompt given as `ChatTemplate.render_parts` parts: special tokens where
        the template's text has them, none from the messages' text. Each run of text between two
        of the template's special tokens is encoded in one piece, as encoding the whole text
        would, so a prompt whose messages hold no special token gets the same ids as `encode`."""
        ids: list[int] = []
        run: list[str] = []  # text since the last special token
        for part in parts:
            if not part.template:
                run.append(part.text)
                continue
            with self._mode:
                encoding = self.tokenizer.encode(part.text, add_special_tokens=False)
            start = 0
            for token, (begin, end) in zip(encoding.ids, encoding.offsets):
                if token in self.special_ids:
                    run.append(part.text[start:begin])
                    ids += self.encode_text("".join(run)).ids
                    ids.append(token)
                    run, start = [], end
            run.append(part.text[start:])
        return ids + self.encode_text("".join(run)).ids

    @property
    def special_ids(self) -> set[int]:
        if self._special_ids is None:
            added = self.tokenizer.get_added_tokens_decoder()
            self._special_ids = {i for i, token in added.items() if token.special}
        return self._special_ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def stream(self) -> StreamingDecoder:
        return StreamingDecoder(self.tokenizer)

    def to_json(self) -> str:
        with self._mode:
            return self.tokenizer.to_str()


class StreamingDecoder:
    """Turns token ids into text one token at a time, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._stream = decoders.DecodeStream(skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        return self._stream.step(self._tokenizer, token_id) or ""
