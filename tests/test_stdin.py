"""`msa ask -` reads stdin in chunks, with the binary check on its first 8 KiB and a size limit
checked as it comes: an endless stream ends with one line, not with memory full."""

from __future__ import annotations

import io
import resource
import subprocess
import sys

import pytest
from processes import LIMIT_S, start_msa

from msa.engine.documents import read_document
from msa.engine.documents.document import MAX_STDIN_BYTES
from msa.models.errors import InputError


class Endless(io.RawIOBase):
    """A pipe that never ends: `byte` forever, counting what was read; a reader that goes on
    past `budget` bytes fails the test (rather than filling memory)."""

    def __init__(self, byte: bytes, budget: int):
        self.byte, self.given, self.budget = byte, 0, budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        assert self.given <= self.budget, f"read {self.given:,} bytes of an endless stream"
        buffer[:] = self.byte * len(buffer)
        self.given += len(buffer)
        return len(buffer)

    def isatty(self) -> bool:
        return False


def piped(monkeypatch, raw: io.RawIOBase) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(raw)))


def test_a_binary_stream_is_refused_after_its_first_chunk(monkeypatch):
    endless = Endless(b"\0", budget=1_000_000)
    piped(monkeypatch, endless)
    with pytest.raises(InputError, match=r"^stdin: looks like a binary file, not text$"):
        read_document("-")
    assert endless.given <= 64 * 1024  # the first read, not the stream


def test_an_endless_text_stream_stops_at_the_limit(monkeypatch):
    endless = Endless(b"a", budget=1_000_000)
    piped(monkeypatch, endless)
    with pytest.raises(InputError, match=r"^stdin: larger than 100,000 bytes \(save it to"):
        read_document("-", max_stdin_bytes=100_000)
    assert endless.given <= 100_000 + 64 * 1024


@pytest.mark.parametrize("size", [99_999, 100_000])
def test_text_up_to_the_limit_is_read_whole(monkeypatch, size):
    piped(monkeypatch, io.BytesIO(b"x" * size))
    assert read_document("-", max_stdin_bytes=100_000).text == "x" * size


def at_most_1_gib() -> None:
    """`msa` may map no more than 1 GiB: one that reads the whole stream fails fast."""
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def run_ask_on(stdin) -> subprocess.CompletedProcess:
    process = start_msa("ask", "-", "What is this?", stdin=stdin, preexec_fn=at_most_1_gib)
    try:
        out, err = process.communicate(timeout=LIMIT_S)
    finally:
        process.kill()  # one that reads on would fill memory
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_msa_ask_on_dev_zero_ends_at_once_with_one_line():
    with open("/dev/zero", "rb") as zero:
        result = run_ask_on(zero)
    assert (result.returncode, result.stdout) == (3, "")
    assert result.stderr == "msa: error: stdin: looks like a binary file, not text\n"


def test_msa_ask_on_an_endless_text_pipe_ends_with_the_size_error():
    yes = subprocess.Popen(["yes", "a line of text"], stdout=subprocess.PIPE)
    try:
        result = run_ask_on(yes.stdout)
    finally:
        yes.kill()
        yes.wait()
    assert (result.returncode, result.stdout) == (3, "")
    assert result.stderr == (
        f"msa: error: stdin: larger than {MAX_STDIN_BYTES:,} bytes "
        "(save it to a file and name the file)\n"
    )
