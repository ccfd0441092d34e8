"""Documents as text: files, directories (walked with .gitignore honoured) and stdin, with PDF,
EPUB and HTML converted; where each file and line sits in the joined text."""

from .context import Context, ContextFile, header, read_context
from .document import Document, read_document

__all__ = ["Context", "ContextFile", "Document", "header", "read_context", "read_document"]
