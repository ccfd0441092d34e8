"""The one place where errors become a one-line message and an exit code.

Exit codes: 0 success, 1 internal error, 2 usage, 3 input error, 4 model missing or unknown,
5 input too long for the model or out of memory, 6 server error (--server: unreachable, refused,
timed out), 7 disk: full, read-only or not writable, 130 interrupted.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys

import typer
import typer.core
import typer.exceptions

from msa.models.errors import DISK_ERRNOS, MsaError, disk_error

from .visible import visible

EXIT_CODES_HELP = (
    "Exit codes: 0 success, 1 internal error, 2 usage, 3 input error, "
    "4 model missing or unknown, 5 input too long or out of memory, 6 server error (--server), "
    "7 disk full, read-only or not writable, 130 interrupted."
)


def _say(message: str) -> None:
    sys.stdout.flush()
    print(f"msa: error: {visible(message)}", file=sys.stderr, flush=True)


# Click's exceptions, as the installed Typer raises them: Typer >= 0.20 carries its own copy of
# Click (typer._click), older ones use Click itself
click = importlib.import_module(typer.BadParameter.__module__)


class UsageLine(click.ClickException):
    """A usage error, shown as one line: `msa: error: '--topk': 0 is not ... (msa ask --help)`."""

    exit_code = 2

    def show(self, file=None) -> None:
        _say(self.message)


def usage_line(error: click.UsageError) -> UsageLine:
    message = " ".join(error.format_message().split())
    if isinstance(error, click.BadParameter):
        message = message.removeprefix("Invalid value for ")
    command = error.ctx.command_path if error.ctx is not None else "msa"
    return UsageLine(f"{message} ({command} --help)")


@contextlib.contextmanager
def _usage_in_one_line():
    try:
        yield
    except click.NoArgsIsHelpError:  # prints the help: not an error line
        raise
    except click.UsageError as e:
        raise usage_line(e) from None


class OneLineUsageGroup(typer.core.TyperGroup):
    """The root command: usage errors, its own or any subcommand's, end in one line on stderr
    and exit 2, where Click prints the usage, a hint and the error on four."""

    def make_context(self, *args, **kwargs):
        with _usage_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _usage_in_one_line():
            return super().invoke(ctx)


def _internal(error: Exception) -> typer.Exit:
    """Say that `error` is msa's own bug, in one line; the exit to raise (code 1)."""
    _say(f"internal error: {type(error).__name__}: {error} (please report this)")
    return typer.Exit(1)


def reports_errors(fn):
    """Wrap a command so the library's errors end it with one line on stderr and their exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (
            typer.Exit,
            typer.Abort,
            typer.exceptions.TyperException,
            SystemExit,
        ):  # usage errors: exit 2
            raise
        except MsaError as e:
            _say(str(e))
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            print("", file=sys.stderr)
            _say("interrupted")
            raise typer.Exit(130) from None
        except MemoryError:
            _say("out of memory: try a shorter input or fewer --max-tokens")
            raise typer.Exit(5) from None
        except BrokenPipeError:
            # the reader of our stdout went away (e.g. `msa ask ... | head -1`): not an error
            sys.stderr.close()
            raise typer.Exit(0) from None
        except OSError as e:
            if e.errno not in DISK_ERRNOS:
                raise _internal(e) from None
            # a disk problem that no library call named: still one line, naming the file
            error = disk_error(e, f"cannot use {e.filename}" if e.filename else "disk")
            _say(str(error))
            raise typer.Exit(error.exit_code) from None
        except Exception as e:  # noqa: BLE001 - the last line of defence, still one line
            raise _internal(e) from None

    return wrapper
