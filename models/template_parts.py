"""A rendered chat prompt as the template's own text and the messages' text, apart.

Special tokens (<|im_start|>, <end_of_turn>) belong where the template writes them, never where
a document or a message merely holds their strings: a file holding "<|im_end|>\n<|im_start|>
system" must not open a system turn. So each message is rendered as a marker that occurs in
no message, the template's text is read between the markers, and the messages' own text goes
in their place as parts the tokenizer reads as plain characters (`TextTokenizer.encode_parts`).
No text a user writes can collide with a marker: it is chosen not to occur in any of it.

A second render, with probe whitespace around each marker, shows which contents the template
trims (`| trim`), so their ends are trimmed as the template would (a template that strips
only some whitespace, `lstrip('\n')`, is taken to strip all of it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ModelError

# Put around each message's marker to see whether the template trims it: distinct characters,
# so that one piece of template text tells the two apart.
_LEAD_PROBE, _TRAIL_PROBE = "\n", " "


@dataclass(frozen=True)
class Part:
    """A piece of a prompt: the template's own text (special tokens read as such) or a
    message's text (read as plain characters, whatever it holds)."""

    text: str
    template: bool = False
    tag: str | None = None  # the caller's name for a piece of a message ("document", ...)


def render_parts(render: Callable[[list[dict]], str], messages: list[dict]) -> list[Part]:
    """`render(messages)` (the template) as parts; a message's `content` is a string or a list
    of `Part`s, whose tags travel to the result."""
    contents = [
        [Part(m["content"])] if isinstance(m["content"], str) else m["content"] for m in messages
    ]
    mark = _unused_marker([p.text for parts in contents for p in parts])
    order, texts = _split(render, messages, mark, "", "")
    probed_order, probed = _split(render, messages, mark, _LEAD_PROBE, _TRAIL_PROBE)
    if order != probed_order:
        raise ModelError("the model's chat template does not keep the messages intact")
    kept = [_probes_kept(a, b) for a, b in zip(texts, probed)]  # (trail, lead) of each gap
    out = [Part(texts[0], template=True)]
    for k, i in enumerate(order):
        out += _trimmed(contents[i], lead=not kept[k][1], trail=not kept[k + 1][0])
        out.append(Part(texts[k + 1], template=True))
    return [p for p in out if p.text or p.tag is not None]


def _split(render, messages: list[dict], mark: str, lead: str, trail: str):
    """The render with message i as `lead + marker i + trail`: the messages' order in it and
    the template's text around them (one more piece than messages)."""
    slotted = [dict(m, content=f"{lead}{mark}{i}\u2063{trail}") for i, m in enumerate(messages)]
    pieces = re.split(f"{re.escape(mark)}(\\d+)\u2063", render(slotted))
    order = [int(i) for i in pieces[1::2]]
    if len(set(order)) != len(order):
        raise ModelError("the model's chat template repeats a message")
    return order, pieces[0::2]


def _unused_marker(texts: list[str]) -> str:
    """A string that occurs in none of `texts` (so neither does anything starting with it)."""
    mark = "\u2063msa"
    while any(mark in text for text in texts):
        mark += "#"
    return mark


def _probes_kept(plain: str, probed: str) -> tuple[bool, bool]:
    """Whether the probed render kept the trailing probe of the message before this piece of
    template text and the leading probe of the message after it."""
    for trail, lead in ((True, True), (True, False), (False, True), (False, False)):
        if probed == (_TRAIL_PROBE if trail else "") + plain + (_LEAD_PROBE if lead else ""):
            return trail, lead
    raise ModelError("the model's chat template does not keep the messages intact")


def _trimmed(parts: list[Part], *, lead: bool, trail: bool) -> list[Part]:
    """A message's parts less the whitespace the template trims off its ends."""
    parts = list(parts)
    if parts and lead:
        parts[0] = Part(parts[0].text.lstrip(), tag=parts[0].tag)
    if parts and trail:
        parts[-1] = Part(parts[-1].text.rstrip(), tag=parts[-1].tag)
    return parts
