"""What a command's --help shows beyond Typer's own: the examples every page ends with,
registered once for the whole command tree, and the panels that group a long list of options
(an option's `rich_help_panel=`, one of the names below)."""

from __future__ import annotations

import typer.core

from .errors import EXIT_CODES_HELP, OneLineUsageGroup

# the panels a command's --help lists its options in, in this order (PanelledCommand); an
# option without one is under the first
OPTIONS = "Options"
OUTPUT = "Output"
MODEL = "Model and speed"
CACHE = "Prefix cache"
ATTENTION = "Attention and K/V"
SERVER = "Answering on a server (--server)"
PANELS = [OPTIONS, OUTPUT, MODEL, CACHE, ATTENTION, SERVER]

# one to three command lines per command, by its path under `msa`; the first is the usual use
EXAMPLES: dict[str, list[str]] = {
    "ask": [
        'msa ask notes.txt "Who signed the lease?"',
        'cat report.md | msa ask - "Summarize the findings" -n 400',
        'msa ask docs/ "Where is the retry limit set?" --sources',
    ],
    "chat": [
        "msa chat -c book.pdf",
        "msa chat -c src/ --sources -m Qwen/Qwen2.5-1.5B-Instruct",
    ],
    "calibrate": ["msa calibrate -m smollm2-135m", "msa calibrate -l 16k --index"],
    "pull": [
        "msa pull Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M",
        "msa pull HuggingFaceTB/SmolLM2-360M-Instruct",
        "msa pull ./model.gguf --name mine",
    ],
    "quantize": ["msa quantize smollm2-135m --to int8"],
    "serve": ["msa serve", "msa serve --port 8080 -m smollm2-135m --max-tokens 1024"],
    "bench": ["msa bench e2e -l 512,8k", "msa bench attention", "msa bench peak"],
    "bench e2e": [
        "msa bench e2e -l 512,8k",
        "msa bench e2e -m model.gguf --json",
        "msa bench e2e -l 16k --selection index --mass 0.95 --topk 64",
    ],
    "bench attention": ["msa bench attention"],
    "bench peak": ["msa bench peak", "msa bench peak --threads 1,2 --json"],
    "eval": ["msa eval passkey -l 4k,16k", "msa eval file questions.jsonl"],
    "eval passkey": ["msa eval passkey -l 4k,16k --attention dense,msa"],
    "eval ruler": ["msa eval ruler -l 4k --tasks niah -n 3"],
    "eval file": ["msa eval file questions.jsonl --attention dense,msa"],
    "eval fidelity": ["msa eval fidelity -l 16k --seeds 2,3,4,5 --results fidelity.jsonl"],
    "cache": ["msa cache ls", "msa cache prune --max-size 2G"],
    "cache ls": ["msa cache ls", "msa cache ls --json"],
    "cache info": ["msa cache info"],
    "cache rm": ["msa cache rm 3f9a1c2b"],
    "cache prune": ["msa cache prune --max-size 2G"],
    "cache clear": ["msa cache clear"],
    "models": ["msa models", "msa models --recommend --doc book.pdf"],
    "models rm": [
        "msa models rm Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M",
        "msa models rm HuggingFaceTB/SmolLM2-360M-Instruct",
    ],
}


def examples_epilog(path: str) -> str:
    """The epilog of the command at `path` (`cache ls`): its examples, kept as written ("\\b"
    stops Click from rewrapping them), then the exit codes."""
    lines = [f"  {example}" for example in EXAMPLES[path]]
    return "\b\nExamples:\n" + "\n".join(lines) + "\n\n" + EXIT_CODES_HELP


def _with_examples(command, path: str) -> None:
    """Give `command` and every command under it its examples."""
    if path in EXAMPLES:
        command.epilog = examples_epilog(path)
    for name, sub in (getattr(command, "commands", None) or {}).items():
        _with_examples(sub, f"{path} {name}".strip())


class ExamplesGroup(OneLineUsageGroup):
    """The root command: on top of one-line usage errors, each command's --help ends with its
    examples (EXAMPLES) and the exit codes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _with_examples(self, "")


class PanelledCommand(typer.core.TyperCommand):
    """A command whose --help lists its options in panels (PANELS, from each option's
    `rich_help_panel`), as Typer's Rich help does, in plain text."""

    def format_options(self, ctx, formatter) -> None:
        arguments, by_panel = [], {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                panel = getattr(param, "rich_help_panel", None) or OPTIONS
                by_panel.setdefault(panel, []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        for panel in sorted(by_panel, key=lambda p: PANELS.index(p) if p in PANELS else 0):
            with formatter.section(panel):
                formatter.write_dl(by_panel[panel])
