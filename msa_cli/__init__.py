"""msa: ask questions about very long documents on your own machine.

The library is `msa.engine`; its main names are here too, imported on first use so that
`import msa` stays light (no PyTorch until a model is loaded):

    import msa
    model = msa.load("smollm2-135m")
    for event in model.session("notes.txt").ask("Where is the key?"):
        ...
"""

from __future__ import annotations

__version__ = "0.1.0"

_ENGINE = {"load", "Model", "Session", "Settings", "Usage"}

__all__ = ["__version__", *sorted(_ENGINE)]


def __getattr__(name: str):
    if name in _ENGINE:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
