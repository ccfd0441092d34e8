"""The engine: what `msa`'s commands call, and what a Python user imports.

    model = load("smollm2-135m")            # a name, a .gguf file or a model folder
    session = model.session("notes.txt")    # paths, or text=...
    for event in session.ask("Where is the key?"):
        ...                                 # events.Reading, Progress, Text, Sources, Done

Names are imported on first use, so `import msa.engine` does not load PyTorch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "load": "model",
    "Model": "model",
    "Session": "session",
    "Settings": "settings",
    "Usage": "generate",
    "Reading": "events",
    "Progress": "events",
    "Text": "events",
    "Sources": "events",
    "Done": "events",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
