"""msa: ask questions about very long documents on your own machine."""

__version__ = "0.1.0"
