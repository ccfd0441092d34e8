"""Sources: the passages an answer read, mapped back to files and lines."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from msa.app import app
from msa.engine.documents import read_context
from msa.engine.prompt import Prompt
from msa.engine.sources import _block_sources

TOPICS = [
    "The river {n} rises in the hills above {p} and runs for {k} kilometres before it reaches "
    "the sea. In spring its water turns brown with melted snow, and the ferry at {p} stops "
    "running for a few weeks until the current slows again.",
    "Every autumn the orchard at {p} harvests about {k} tonnes of apples. Most of them are "
    "pressed into cider in the old stone barn, and the rest are sold at the Saturday market "
    "along with honey and walnuts.",
    "The railway line through {p} was opened in {y}. Its viaduct has {k} arches of red brick, "
    "and steam trains still cross it twice a week in summer, carrying visitors to the coast.",
    "In {y} a storm flooded the lower streets of {p}. The water rose {k} centimetres above the "
    "doorsteps, and the town built a new sea wall the following year, paid for by a tax on "
    "fishing licences.",
    "The library of {p} holds {k} thousand books, among them a collection of old maps of the "
    "region. It is open every weekday morning, and on Thursdays a volunteer reads stories to "
    "children in the garden.",
    "Mount {n} is {k} metres high. The path to its summit starts near a small chapel and climbs "
    "through pine forest and then over bare rock, and walkers are advised to start before dawn "
    "in July.",
    "The football club of {p} first played in {y}. It plays in green shirts, and its small "
    "wooden stadium, which holds {k} hundred people, is one of the oldest still in use in the "
    "country.",
    "The school in {p} teaches {k} pupils between the ages of five and eleven. Its building was "
    "once a wool warehouse, and the pupils grow vegetables in a long garden behind the "
    "playground.",
    "A windmill has stood on the hill above {p} since {y}. It ground flour until the nineteen "
    "fifties, and after a restoration its sails turn again on the first Sunday of each month.",
    "The choir of {p} sings every December in the market square. It has {k} members, and its "
    "oldest song, written in {y}, tells of a shepherd who lost his flock in the snow.",
]
NAMES = [
    "Alder",
    "Bramley",
    "Carrow",
    "Dunmore",
    "Elsby",
    "Fenwick",
    "Garth",
    "Halloway",
    "Ivel",
    "Jorden",
    "Kestle",
    "Lanyon",
    "Morvah",
    "Nancledra",
    "Orme",
    "Penrose",
    "Quarne",
    "Redruth",
    "Sennen",
    "Tregony",
    "Ulverly",
    "Veryan",
    "Wadebridge",
    "Yelland",
    "Zennor",
]
TARGET = (
    "The bakery on Willow Lane was founded in 1923 by a woman named Henrietta Quill. She baked "
    "rye bread "
    "in a wood-fired oven, and her granddaughter still runs the shop today, opening at six every "
    "morning."
)


def _document(n=40, depth=0.6, seed=1):
    r = random.Random(seed)
    paras = []
    for i in range(n):
        t = TOPICS[i % len(TOPICS)]
        paras.append(
            t.format(
                n=r.choice(NAMES), p=r.choice(NAMES), k=r.randint(12, 900), y=r.randint(1700, 1990)
            )
        )
    at = int(n * depth)
    paras.insert(at, TARGET)
    return "\n\n".join(paras) + "\n", at


SEEDS = range(1, 8)
# Ranked by what the question and its answer read, the answer's paragraph is first for every
# seed here (measured 2026-12-07: 7 of 7; by the question's attention alone it was 2 of 7)
RANKS_FIRST_AT_LEAST = 7


@pytest.mark.slow
def test_the_paragraph_that_holds_the_answer_is_among_the_sources(embedded, tmp_path):
    first = 0
    for seed in SEEDS:
        text, _ = _document(n=56, seed=seed)  # about 2,900 tokens, 45 blocks
        doc = tmp_path / f"town-{seed}.txt"
        doc.write_text(text)
        line = text[: text.index(TARGET)].count("\n") + 1
        result = CliRunner().invoke(
            app,
            [
                "ask",
                str(doc),
                "Who founded the bakery on Willow Lane?",
                "-n",
                "2",
                "--sources",
                "--json",
                "--no-cache",
            ],
        )
        assert result.exit_code == 0, result.output
        sources = json.loads(result.stdout)["sources"]
        assert all(s["path"] == str(doc) and s["text"] in text for s in sources)
        assert all(0 < s["score"] <= 1 for s in sources) and [
            s["score"] for s in sources
        ] == sorted((s["score"] for s in sources), reverse=True)
        holding = [
            rank
            for rank, s in enumerate(sources)
            if s["start_line"] <= line <= s["end_line"] and "Willow Lane" in s["text"]
        ]
        assert holding, (seed, [(s["start_line"], s["end_line"]) for s in sources], line)
        first += holding[0] == 0
    assert first >= RANKS_FIRST_AT_LEAST, first


@pytest.mark.slow
def test_sources_on_the_terminal_and_from_stdin(embedded):
    text, _ = _document(n=4, seed=3)
    result = CliRunner().invoke(
        app,
        [
            "ask",
            "-",
            "Who founded the bakery on Willow Lane?",
            "-n",
            "1",
            "--sources",
            "--no-cache",
        ],
        input=text,
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[2] == "Sources:" and len(lines) > 3
    assert all(line.startswith("  -:") for line in lines[3:])


def test_a_block_across_two_files_is_a_part_in_each(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    (tmp_path / "b.txt").write_text("three\nfour\n")
    ctx = read_context([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])
    offsets = [(i, i + 1) for i in range(len(ctx.text))]  # a token per character
    prompt = Prompt(head=[0] * 4, document=[0] * len(ctx.text), tail=[], document_offsets=offsets)
    block_size = 4 + len(ctx.text)  # one block holds both files
    parts = _block_sources(0, 1.0, block_size, prompt, ctx)
    assert [(s.path, s.start_line, s.end_line, s.text) for s in parts] == [
        (str(tmp_path / "a.txt"), 1, 2, "one\ntwo"),
        (str(tmp_path / "b.txt"), 1, 2, "three\nfour"),
    ]
    assert [round(s.score, 6) for s in parts] == [
        round(7 / 17, 6),
        round(10 / 17, 6),
    ]  # shared by characters


FOLDER = {
    "bread.txt": "The bakery bakes a sourdough loaf every morning.\n"
    "The dough is mixed at night and left to rise for fourteen hours in a cool room.\n"
    "It is shaped at five, proved in cane baskets, and baked in a stone oven at 250 degrees.\n"
    "The crust is dark and the crumb is open, and the loaves sell out before nine.\n",
    "choir.txt": "The village choir has thirty members and meets on Tuesday evenings in the "
    "church hall.\n"
    "Its conductor, a retired music teacher named Edith Marlow, chose the programme for the "
    "winter concert.\n"
    "The choir sings carols in the market square every December.\n"
    "Its oldest song tells of a shepherd who lost his flock in the snow.\n",
    "garden.txt": "The garden behind the house has six raised beds of vegetables.\n"
    "Tomatoes are planted in late May, after the last frost, and staked with hazel poles.\n"
    "The beans climb a frame of willow, and the courgettes spread over the path by August.\n"
    "Every autumn the beds are covered with a thick layer of compost from the heap by the "
    "shed.\n",
    "trains.txt": "The branch line to the coast opened in 1894 and closed in 1963.\n"
    "Its viaduct of forty brick arches still stands over the river valley.\n"
    "A society of volunteers restored two miles of track and runs a steam train on Sundays.\n"
    "The engine, a tank locomotive built in Leeds, is painted dark green.\n",
}
# each question's answer is on line 2 of one file (which must come first), and the embedded model
# answers it from there (bread.txt's question it answers wrongly: what it read is no reference)
QUESTIONS = {
    "When are the tomatoes planted?": ("garden.txt", "May"),
    "What is the name of the choir's conductor?": ("choir.txt", "Marlow"),
    "When did the branch line open?": ("trains.txt", "1894"),
}


@pytest.mark.slow
def test_each_question_over_a_folder_puts_its_own_file_first(embedded, tmp_path):
    """What the answer read for this question, not the same passages whatever was asked: with
    the question's tokens alone, the tomato question put trains.txt first."""
    folder = tmp_path / "notes"
    folder.mkdir()
    for name, text in FOLDER.items():
        (folder / name).write_text(text)
    for question, (holding, fact) in QUESTIONS.items():
        result = CliRunner().invoke(
            app,
            ["ask", str(folder), question, "-n", "24", "--sources", "--json", "--no-cache"],
        )
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert fact in out["answer"], (question, out["answer"])
        sources, first = out["sources"], out["sources"][0]
        assert first["path"] == str(folder / holding), (question, sources)
        assert first["start_line"] <= 2 <= first["end_line"], (question, first)
