"""The `msa` command: the root Typer app, which registers each command group's module."""

from __future__ import annotations

import typer

from .. import __version__
from ..engine import idle_cores  # noqa: F401  (imported first: its window starts at msa's start)
from .ask import ask
from .bench import bench_app
from .cache import cache_app
from .calibrate import calibrate
from .chat import chat
from .errors import EXIT_CODES_HELP
from .eval import eval_app
from .eval_fidelity import eval_fidelity
from .help_pages import ExamplesGroup, PanelledCommand
from .models import models_app, quantize
from .pull_command import pull
from .serve import serve

app = typer.Typer(
    name="msa",
    cls=ExamplesGroup,
    help="Ask questions about very long documents, on your own machine.\n\n" + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(bench_app, name="bench")
eval_app.command("fidelity")(eval_fidelity)
app.add_typer(eval_app, name="eval")
app.add_typer(cache_app, name="cache")
# each command's --help ends with its examples and the exit codes (examples.py)
app.command(cls=PanelledCommand)(ask)
app.command(cls=PanelledCommand)(chat)
app.command()(calibrate)
app.add_typer(models_app, name="models")
app.command()(pull)
app.command("quantize")(quantize)
app.command(cls=PanelledCommand)(serve)


def _version(value: bool):
    if value:
        print(f"msa {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
):
    pass


def main() -> None:
    app(prog_name="msa")
