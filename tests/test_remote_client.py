"""`msa ask` and `msa chat` with --server, against `msa serve` on loopback: the same greedy
answers as the local engine, and one clear line (exit code 6, or 5) when the server refuses,
is not there, or does not answer in time."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from processes import LIMIT_S
from serving import serving
from typer.testing import CliRunner

from msa.app import app
from msa.commands.remote_session import LOCAL_ONLY_SOURCES
from msa.engine.prompt import build_prompt
from msa.models.attention_settings import AttentionSettings

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "harbor-town.txt"
QUESTION = "What was the name of the first keeper?"


def run(*args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def one_error_line(result, exit_code: int) -> str:
    assert result.exit_code == exit_code, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("msa: error: "), result.stderr
    return lines[0]


@pytest.mark.slow
def test_ask_through_the_server_answers_as_the_local_engine_does(embedded):
    local = run("ask", EXAMPLE, QUESTION, "-n", "8", "--json")
    assert local.exit_code == 0, local.output
    reference = json.loads(local.stdout)
    context = build_prompt(embedded.tokenizer, EXAMPLE.read_text(), QUESTION).context_length
    with serving(embedded) as url:
        streamed = run("ask", EXAMPLE, QUESTION, "-n", "8", "--server", url)
        as_json = run("ask", EXAMPLE, QUESTION, "-n", "8", "--server", f"{url}/v1/", "--json")
    assert streamed.exit_code == 0, streamed.output
    assert streamed.stdout == reference["answer"] + "\n"
    assert as_json.exit_code == 0, as_json.output
    remote = json.loads(as_json.stdout)
    assert remote["answer"] == reference["answer"]
    assert remote["model"] == "smollm2-135m" and remote["server"] == f"{url}/v1"
    assert (remote["prompt_tokens"], remote["generated_tokens"], remote["finish_reason"]) == (
        reference["prompt_tokens"],
        reference["generated_tokens"],
        reference["finish_reason"],
    )
    assert remote["cached_tokens"] == context  # the server read the document from msa ask's cache


@pytest.mark.slow
def test_chat_through_the_server(embedded):
    local = run("ask", EXAMPLE, QUESTION, "-n", "8", "--json")
    assert local.exit_code == 0, local.output
    first_answer = json.loads(local.stdout)["answer"]
    context = build_prompt(embedded.tokenizer, EXAMPLE.read_text(), QUESTION).context_length
    with serving(embedded) as url:
        result = run(
            "chat",
            "-c",
            EXAMPLE,
            "-n",
            "8",
            "-q",
            "--server",
            url,
            input=f"{QUESTION}\n/sources\nWhere is Corran Point?\n/stats\n",
        )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == first_answer  # the first turn is msa ask's prompt
    assert lines[1] == LOCAL_ONLY_SOURCES
    assert lines[2].strip()
    assert lines[3].startswith("documents: 1 files, answered by smollm2-135m")
    assert lines[4] == "conversation: 2 turns"
    # the second turn resends the conversation: the server read the document from its cache
    assert f"({context:,} from the server's prefix cache)" in lines[5]


@pytest.mark.slow
def test_a_refused_key_is_one_line_and_exit_code_6(embedded):
    with serving(embedded, api_key="right") as url:
        wrong = run("ask", EXAMPLE, QUESTION, "--server", url, "--api-key", "wrong")
        missing = run("ask", EXAMPLE, QUESTION, "--server", url)
        other_model = run(
            "ask", EXAMPLE, QUESTION, "--server", url, "--api-key", "right", "-m", "qwen3-0.6b"
        )
    for result in (wrong, missing):
        line = one_error_line(result, 6)
        assert (
            f"the server at {url}/v1 refused the API key (HTTP 401" in line and "--api-key" in line
        )
    assert "does not serve 'qwen3-0.6b' (it serves: smollm2-135m)" in one_error_line(other_model, 6)


@pytest.mark.slow
def test_a_prompt_too_long_for_the_server_is_exit_code_5(embedded, tmp_path):
    long_document = tmp_path / "long.txt"
    long_document.write_text(
        "The tide came in over the rocks of Corran Point. " * 900
    )  # about 10K tokens
    with serving(embedded, attention=AttentionSettings(mode="dense")) as url:
        result = run("ask", long_document, "Where?", "-n", "8", "--server", url)
    assert "8,192" in one_error_line(result, 5)


def test_a_dead_server_is_one_line_and_exit_code_6():
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    line = one_error_line(run("ask", EXAMPLE, QUESTION, "--server", f"http://127.0.0.1:{port}"), 6)
    assert f"cannot reach the server at http://127.0.0.1:{port}/v1" in line


def test_a_server_that_never_answers_times_out():
    with socket.socket() as sock:  # accepts connections (the backlog) and never answers them
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        result = run("ask", EXAMPLE, QUESTION, "--server", url, "--timeout", "0.5")
    assert f"the server at {url}/v1 did not answer within 0.5 s (--timeout)" in one_error_line(
        result, 6
    )


def test_local_engine_features_say_so_with_a_server():
    result = run("ask", EXAMPLE, QUESTION, "--server", "http://127.0.0.1:9", "--sources")
    assert (
        result.exit_code == 2 and "--sources" in result.stderr and "local engine" in result.stderr
    )


def test_a_server_url_must_be_http():
    result = run("ask", EXAMPLE, QUESTION, "--server", "gpu-box:8000")
    assert result.exit_code == 2 and "is not an http:// or https:// URL" in result.stderr


def test_a_client_does_not_load_pytorch():
    # the whole `msa ask --server` path, in a fresh interpreter, to its error for a dead port
    code = (
        "import sys, msa.app\n"
        "sys.argv = ['msa', 'ask', sys.argv[1], 'q', '--server', 'http://127.0.0.1:9']\n"
        "try:\n    msa.app.main()\n"
        "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(EXAMPLE)], capture_output=True, text=True, timeout=LIMIT_S
    )
    assert done.stdout.split() == ["6", "False"], done.stdout + done.stderr
