"""The `msa` command's entry point (pyproject's `msa = "msa.app:main"`, `python -m msa.app`);
the commands are in `msa.commands`."""

from .commands.app import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
