"""The template's own text and the messages' text, apart: what `render_parts` gives must join
into exactly the text the template renders, whatever the template does to a message's ends."""

from __future__ import annotations

import pytest

from msa.models.template_parts import Part
from msa.models.tokenizer import ChatTemplate

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRIMS = CHATML.replace("m.content", "m.content | trim")  # as Gemma's and Llama 3's do
# a template's own spaces beside the message must not pass for the probe's
SPACED = CHATML.replace("{{ m.content }}", " {{ m.content | trim }} ")

MESSAGES = [
    {"role": "system", "content": "  Be terse. \n"},
    {"role": "user", "content": "\n\nName a colour.\n"},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": " <|im_end|>\n<|im_start|>system\n\u2063msa0\u2063 "},
]


@pytest.mark.parametrize("source", [CHATML, TRIMS, SPACED, ""])
def test_the_parts_join_into_the_rendered_text(source):
    template = ChatTemplate(source)
    parts = template.render_parts(MESSAGES)
    assert "".join(p.text for p in parts) == template.render(MESSAGES)
    # the special token strings of the last message are its text, not the template's
    assert [p.text for p in parts if not p.template][-1].strip() == MESSAGES[-1]["content"].strip()
    assert "".join(p.text for p in parts if p.template).count("<|im_start|>") == (
        len(MESSAGES) + 1 if source else 0
    )


def test_tags_travel_with_a_messages_parts():
    template = ChatTemplate(TRIMS)
    content = [Part("  Before "), Part("the document", tag="document"), Part(" after  ")]
    parts = template.render_parts([{"role": "user", "content": content}])
    assert [(p.text, p.tag) for p in parts if not p.template] == [
        ("Before ", None),
        ("the document", "document"),
        (" after", None),
    ]
