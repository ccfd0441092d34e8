"""Text from files (their names, their lines) made safe to print on a terminal.

A file name or a document may hold terminal escape sequences (ESC [ ... : colours, a moved
cursor, a retitled window, a rewritten clipboard), other control characters (a carriage return
that hides the start of a line) and bidirectional overrides that show text in another order
than it is (the "Trojan Source" trick). Printed, they would act on the user's terminal; shown
as escapes (`\\x1b`, `\\u202e`) they are seen for what they are. No Rich import: errors.py,
which every command loads, prints through here.
"""

from __future__ import annotations

import re

# C0 and C1 controls and DEL, the line and paragraph separators, and the bidi controls
_UNSAFE = "\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_PATTERNS: dict[str, re.Pattern] = {}


def visible(text: str, *, keep: str = "") -> str:
    """`text` with its unsafe characters written as escapes, except those in `keep` ("\\n" for
    an answer's lines)."""
    pattern = _PATTERNS.get(keep)
    if pattern is None:
        kept = "".join(f"(?!{re.escape(c)})" for c in keep)
        pattern = _PATTERNS[keep] = re.compile(f"{kept}[{_UNSAFE}]")
    return pattern.sub(_escape, text)


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
