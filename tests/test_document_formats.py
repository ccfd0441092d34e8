"""PDF, EPUB and HTML documents as text with page and chapter markers (msa.converters),
read as files and in directories, cited by page in sources; and refused without the extra.
Fixtures are written at test time: PDFs with fpdf2, EPUBs with EbookLib, HTML by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msa.app import app
from msa.engine.documents import read_context, read_document
from msa.models.errors import InputError

pytest.importorskip("pypdf")
pytest.importorskip("ebooklib")
pytest.importorskip("bs4")
fpdf = pytest.importorskip("fpdf")

HTML = b"""<!doctype html><html><head><title>Not text</title><style>p { color: red }</style></head>
<body><script>var hidden = 1;</script>
<h1>The  Harbor</h1><p>Ships <b>come</b> in.<br>Every day.</p>
<ul><li>one</li><li>two &amp; three</li></ul>
<h2>The Tower</h2><div><p>It has 112 steps.</p></div></body></html>"""
HTML_TEXT = (
    "The Harbor\n\nShips come in.\nEvery day.\n\none\n\ntwo & three\n\n"
    "The Tower\n\nIt has 112 steps.\n"
)


def write_pdf(path: Path, pages: list[str]) -> Path:
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=11)
    for text in pages:
        pdf.add_page()
        if text:
            pdf.multi_cell(0, 6, text)
    pdf.output(str(path))
    return path


def write_epub(path: Path, chapters: list[tuple[str, str]]) -> Path:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("msa-test")
    book.set_title("A test book")
    book.set_language("en")
    items = []
    for i, (title, body) in enumerate(chapters):
        item = epub.EpubHtml(title=title, file_name=f"chapter{i}.xhtml", lang="en")
        item.content = f"<h1>{title}</h1>" + "".join(f"<p>{p}</p>" for p in body.split("\n"))
        book.add_item(item)
        items.append(item)
    book.toc = tuple(items)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *items]
    epub.write_epub(str(path), book)
    return path


def test_pdf_pages_become_marked_text(tmp_path):
    path = write_pdf(
        tmp_path / "book.pdf",
        [
            "The harbor opened in 1847.\nShips came in.",
            "The tower has 112 steps.",
            "The last keeper left in 1989.",
        ],
    )
    doc = read_document(str(path))
    assert doc.text == (
        "[page 1]\nThe harbor opened in 1847.\nShips came in.\n\n[page 2]\nThe tower has 112 "
        "steps.\n\n"
        "[page 3]\nThe last keeper left in 1989.\n"
    )
    context = read_context([str(path)])
    assert context.files[0].section_at(doc.text.index("112 steps")) == "page 2"
    assert context.files[0].section_at(doc.text.index("1989")) == "page 3"


def test_epub_chapters_in_reading_order_titled_from_the_table_of_contents(tmp_path):
    path = write_epub(
        tmp_path / "book.epub",
        [("The Harbor", "Ships come in."), ("The Tower", "It has 112 steps.\nAnd a lamp.")],
    )
    doc = read_document(str(path))
    assert doc.text == (
        "[chapter 1: The Harbor]\nThe Harbor\n\nShips come in.\n\n"
        "[chapter 2: The Tower]\nThe Tower\n\nIt has 112 steps.\n\nAnd a lamp.\n"
    )
    assert [label for _, label in doc.sections] == ["chapter 1: The Harbor", "chapter 2: The Tower"]
    assert doc.text[doc.sections[1][0] :].startswith("[chapter 2: The Tower]\n")


def test_html_visible_text_with_headings_as_sections(tmp_path):
    path = tmp_path / "page.html"
    path.write_bytes(HTML)
    doc = read_document(str(path))
    assert doc.text == HTML_TEXT
    assert doc.sections == [(0, "The Harbor"), (HTML_TEXT.index("The Tower"), "The Tower")]


def test_a_directory_reads_documents_with_their_sections_in_place(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    write_pdf(root / "a.pdf", ["First page.", "Second page."])
    (root / "b.html").write_bytes(HTML)
    (root / "c.txt").write_text("plain\n")
    warnings = []
    context = read_context([str(root)], warn=warnings.append)
    assert [f.path for f in context.files] == [str(root / n) for n in ("a.pdf", "b.html", "c.txt")]
    assert warnings == [] and context.skipped == []
    pdf, html, txt = context.files
    assert context.text[pdf.start : pdf.end] == "[page 1]\nFirst page.\n\n[page 2]\nSecond page.\n"
    assert pdf.section_at(context.text.index("Second page")) == "page 2"
    assert html.section_at(context.text.index("112 steps")) == "The Tower"
    assert txt.section_at(context.text.index("plain")) is None


@pytest.mark.parametrize(
    "name,data,message",
    [
        ("junk.pdf", b"%PDF-1.4 this is not really a pdf", "not a readable PDF"),
        ("junk.epub", b"PK not a zip", "not a readable EPUB"),
        ("empty.html", b"<html><body><script>x()</script></body></html>", "holds no text"),
    ],
)
def test_unreadable_documents_are_input_errors(tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(InputError, match=message):
        read_document(str(path))


def test_a_pdf_without_text_is_refused(tmp_path):
    path = write_pdf(tmp_path / "scan.pdf", ["", ""])
    with pytest.raises(InputError, match="holds no text"):
        read_document(str(path))


@pytest.fixture
def without_docs_extra(monkeypatch):
    """As if `msa[docs]` were not installed: importing its libraries fails."""
    for module in ("pypdf", "ebooklib", "bs4"):
        monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize("suffix", [".pdf", ".epub", ".html"])
def test_without_the_extra_a_document_is_refused_with_the_install_hint(
    tmp_path, without_docs_extra, suffix
):
    path = tmp_path / f"book{suffix}"
    path.write_bytes(b"whatever")
    result = CliRunner().invoke(app, ["ask", str(path), "q"])
    kind = {".pdf": "PDF", ".epub": "EPUB", ".html": "HTML"}[suffix]
    assert result.exit_code == 3
    assert result.stderr.startswith(
        f"msa: error: {path}: a {kind} document; reading it needs the docs extra: "
        "pip install 'msa[docs]'"
    )
    assert result.stderr.count("\n") == 1


def test_without_the_extra_a_directory_skips_documents_with_one_warning_each(
    tmp_path, without_docs_extra
):
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.pdf").write_bytes(b"%PDF-1.4")
    (root / "b.txt").write_text("text\n")
    warnings = []
    context = read_context([str(root)], warn=warnings.append)
    assert [f.path for f in context.files] == [str(root / "b.txt")]
    assert warnings == [
        f"skipped {root / 'a.pdf'}: a PDF document; reading it needs the docs extra: "
        "pip install 'msa[docs]' (pypdf is missing)"
    ]


def test_a_source_names_its_page_and_a_block_across_two_pages_is_a_part_in_each(tmp_path):
    from msa.engine.prompt import Prompt
    from msa.engine.sources import _block_sources

    path = write_pdf(tmp_path / "book.pdf", ["one\ntwo", "three"])
    context = read_context([str(path)])
    assert context.text == "[page 1]\none\ntwo\n\n[page 2]\nthree\n"
    offsets = [(i, i + 1) for i in range(len(context.text))]  # a token per character
    prompt = Prompt(
        head=[0] * 4, document=[0] * len(context.text), tail=[], document_offsets=offsets
    )
    second_line = context.text.index("one")
    parts = _block_sources(0, 1.0, 4 + len(context.text), prompt, context)  # one block, both pages
    assert [(s.start_line, s.end_line, s.section, s.text) for s in parts] == [
        (1, 3, "page 1", "[page 1]\none\ntwo"),
        (5, 6, "page 2", "[page 2]\nthree"),
    ]
    assert [round(s.score, 6) for s in parts] == [round(16 / 30, 6), round(14 / 30, 6)]
    assert parts[1].line().startswith(f"{path}:5-6 (page 2)  0.47  ")
    assert parts[1].as_json()["section"] == "page 2"
    later = _block_sources(0, 1.0, 4 + second_line + 3, prompt, context)  # a block inside page 1
    assert [(s.section, s.text) for s in later] == [("page 1", "[page 1]\none")]


def test_a_pdf_pypdf_cannot_decode_is_skipped_from_a_directory(tmp_path, monkeypatch):
    """pypdf's DependencyError (a JBIG2 image without jbig2dec) is no PyPdfError: it ended the
    whole directory's reading."""
    import pypdf
    from pypdf.errors import DependencyError

    root = tmp_path / "docs"
    root.mkdir()
    write_pdf(root / "a.pdf", ["Readable."])
    undecodable = write_pdf(root / "b.pdf", ["Not decodable."])
    undecodable.write_bytes(undecodable.read_bytes() + b"%undecodable\n")
    (root / "c.txt").write_text("plain text\n")
    real = pypdf.PdfReader

    def reader(stream, *args, **kwargs):
        if b"%undecodable" in stream.getvalue():
            raise DependencyError("jbig2dec binary is not available.")
        return real(stream, *args, **kwargs)

    monkeypatch.setattr(pypdf, "PdfReader", reader)
    warnings: list[str] = []
    context = read_context([str(root)], warn=warnings.append)
    assert [f.path for f in context.files] == [str(root / "a.pdf"), str(root / "c.txt")]
    assert warnings == [
        f"skipped {root / 'b.pdf'}: not a readable PDF "
        "(DependencyError: jbig2dec binary is not available.)"
    ]


def test_pypdf_never_runs_an_external_decoder(tmp_path, monkeypatch):
    """Where jbig2dec is installed pypdf runs it on a JBIG2 image: not on msa's documents."""
    import pypdf

    if not hasattr(pypdf, "get_configuration"):
        pytest.skip("pypdf < 7 keeps the decoder in a module global")
    seen = []
    real = pypdf.PdfReader

    def reader(*args, **kwargs):
        seen.append(pypdf.get_configuration().jbig2dec_binary)
        return real(*args, **kwargs)

    monkeypatch.setattr(pypdf, "PdfReader", reader)
    before = pypdf.get_configuration()
    pypdf.overwrite_configuration(jbig2dec_binary="/usr/bin/jbig2dec")  # as if installed
    try:
        read_document(str(write_pdf(tmp_path / "a.pdf", ["Text."])))
        assert pypdf.get_configuration().jbig2dec_binary == "/usr/bin/jbig2dec"
    finally:
        pypdf.overwrite_configuration(before)
    assert seen == [None]
