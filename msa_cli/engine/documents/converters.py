"""PDF, EPUB and HTML documents as text, with the places sources can name (pages, chapters).

The optional extra `msa[docs]` brings the libraries: pypdf (PDF text, page by page, with the
document's own page labels), EbookLib (an EPUB's chapters in reading order, titled from its
table of contents) and Beautiful Soup (HTML and EPUB chapters to text). Without it, such a file
is refused with one line saying how to install it.

Each page or chapter starts with a marker line, `[page 12]` or `[chapter 3: The Tower]`, so
the model sees where it is; `Converted.sections` records where each starts in the text, so a
source can say which page or chapter it is on. HTML has no pages: its sections are its `<h1>`
and `<h2>` headings.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from pathlib import Path

from msa.models.errors import InputError

FORMATS = {".pdf": "PDF", ".epub": "EPUB", ".html": "HTML", ".htm": "HTML", ".xhtml": "HTML"}
INSTALL_HINT = "pip install 'msa[docs]'"

# Tags that start a new line of text; the rest (inline) run into their neighbours.
_BLOCK_TAGS = [
    "address",
    "article",
    "aside",
    "blockquote",
    "dd",
    "div",
    "dl",
    "dt",
    "figcaption",
    "figure",
    "footer",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "tr",
    "ul",
]
_INVISIBLE_TAGS = ["script", "style", "noscript", "template", "head", "svg"]
_SECTION_MARK = (
    "\ue000"  # brackets a heading's text until the text is laid out (a private-use character)
)


@dataclass
class Converted:
    text: str
    sections: list[tuple[int, str]] = field(default_factory=list)  # (character offset, "page 3")


def format_of(path: str) -> str | None:
    """ "PDF", "EPUB" or "HTML" for a path these converters read, else None."""
    return FORMATS.get(Path(path).suffix.lower())


def convert(path: str, data: bytes) -> Converted:
    """The text of the PDF, EPUB or HTML document `data` (read from `path`)."""
    kind = format_of(path)
    try:
        if kind == "PDF":
            return _pdf(path, data)
        if kind == "EPUB":
            return _epub(path, data)
        if kind == "HTML":
            return _html(path, data)
    except ImportError as e:
        raise InputError(
            f"{path}: a {kind} document; reading it needs the docs extra: {INSTALL_HINT} "
            f"({e.name or 'a library'} is missing)"
        ) from None
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - the libraries fail on damaged or unusual files in
        # many ways (PdfReadError, pypdf's DependencyError for JBIG2, KeyError, RecursionError...)
        raise InputError(f"{path}: not a readable {kind} ({type(e).__name__}: {e})") from None
    raise InputError(f"{path}: not a PDF, EPUB or HTML document")


class _Builder:
    """Text laid out piece by piece, with where each section starts."""

    def __init__(self):
        self.parts: list[str] = []
        self.length = 0
        self.sections: list[tuple[int, str]] = []
        self.has_text = False

    def section(self, label: str, marker: str) -> None:
        if self.parts:
            self.add("\n", text=False)  # a blank line between pages or chapters
        self.sections.append((self.length, label))
        self.add(marker + "\n", text=False)

    def add(self, piece: str, *, text: bool = True) -> None:
        self.parts.append(piece)
        self.length += len(piece)
        self.has_text = self.has_text or (text and bool(piece.strip()))

    def result(self, path: str) -> Converted:
        if not self.has_text:
            raise InputError(
                f"{path}: holds no text (a scanned document? msa reads text, not images)"
            )
        return Converted("".join(self.parts), self.sections)


def _pdf(path: str, data: bytes) -> Converted:
    with _no_external_decoders():
        return _pdf_text(path, data)


def _no_external_decoders():
    """pypdf hands JBIG2 images to the `jbig2dec` program where one is installed: never, for
    documents that may come from anyone (and msa reads text, not images)."""
    import pypdf

    if hasattr(pypdf, "apply_configuration"):  # pypdf >= 7
        return pypdf.apply_configuration(jbig2dec_binary=None)
    import pypdf.filters

    if hasattr(pypdf.filters, "JBIG2DEC_BINARY"):  # pypdf 5 and 6 read this global
        pypdf.filters.JBIG2DEC_BINARY = None
    return contextlib.nullcontext()


def _pdf_text(path: str, data: bytes) -> Converted:
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not reader.decrypt(""):
        raise InputError(f"{path}: the PDF is encrypted")
    labels = reader.page_labels
    out = _Builder()
    for i, page in enumerate(reader.pages):
        label = labels[i] if i < len(labels) else str(i + 1)
        out.section(f"page {label}", f"[page {label}]")
        text = (page.extract_text() or "").strip("\n")
        if text:
            out.add(text + "\n")
    return out.result(path)


def _epub(path: str, data: bytes) -> Converted:
    import ebooklib
    from ebooklib import epub

    book = epub.read_epub(io.BytesIO(data), options={"ignore_ncx": True})
    titles = dict(_toc_titles(book.toc))
    out = _Builder()
    chapter = 0
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        if (
            item is None
            or isinstance(item, epub.EpubNav)
            or item.get_type() != ebooklib.ITEM_DOCUMENT
        ):
            continue
        body = _html_text(item.get_content()).text
        if not body.strip():
            continue
        chapter += 1
        title = titles.get(item.get_name())
        label = f"chapter {chapter}: {title}" if title else f"chapter {chapter}"
        out.section(label, f"[{label}]")
        out.add(body if body.endswith("\n") else body + "\n")
    return out.result(path)


def _toc_titles(toc):
    """(file name, title) of every entry of an EPUB's table of contents, nested ones too."""
    for entry in toc:
        if isinstance(entry, tuple):  # (Section, [children])
            section, children = entry
            if getattr(section, "href", None):
                yield section.href.split("#")[0], section.title
            yield from _toc_titles(children)
        elif getattr(entry, "href", None):
            yield entry.href.split("#")[0], entry.title


def _html(path: str, data: bytes) -> Converted:
    converted = _html_text(data)
    if not converted.text.strip():
        raise InputError(f"{path}: holds no text")
    return converted


def _html_text(data: bytes) -> Converted:
    """Visible text, one line per block element; `<h1>`/`<h2>` headings are sections."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(data, "html.parser")
    for tag in soup(_INVISIBLE_TAGS):
        tag.decompose()
    for br in soup.find_all("br"):
        br.replace_with("\n")
    for heading in soup.find_all(["h1", "h2"]):
        title = " ".join(heading.get_text(" ").split())
        heading.clear()
        heading.append(f"{_SECTION_MARK}{title}{_SECTION_MARK}")
    for tag in soup.find_all(_BLOCK_TAGS):
        tag.insert_before("\n")
        tag.insert_after("\n")
    out = _Builder()
    blank = True  # the last line written was blank (or nothing yet)
    for raw in soup.get_text().splitlines():
        line = " ".join(raw.split())
        if line.startswith(_SECTION_MARK) and line.endswith(_SECTION_MARK) and len(line) > 2:
            if not blank:
                out.add("\n", text=False)
            title = line.strip(_SECTION_MARK)
            out.sections.append((out.length, title))
            out.add(title + "\n")
            blank = False
        elif line:
            out.add(line.replace(_SECTION_MARK, "") + "\n")
            blank = False
        elif not blank:
            out.add("\n", text=False)
            blank = True
    text = "".join(out.parts)
    return Converted(text[:-1] if text.endswith("\n\n") else text, out.sections)
