"""`msa pull MODEL`: download a model from the hub (pull.py), or register a local file by name."""

from __future__ import annotations

import typer

from .errors import reports_errors
from .options import QuietOption


@reports_errors
def pull(
    model: str = typer.Argument(
        ...,
        metavar="MODEL",
        help="A registry name (see `msa models`), a Hugging Face repository id (owner/name), a "
        "GGUF of one (owner/name:QUANT, e.g. :Q4_K_M, or owner/name/file.gguf), or a local "
        ".gguf file or model folder to register.",
    ),
    name: str | None = typer.Option(
        None, "--name", help="The name a local file is registered under (default: its file name)."
    ),
    quiet: bool = QuietOption,
):
    """Download a model from the Hugging Face hub (HF_ENDPOINT, default huggingface.co), or
    register a local GGUF file or model folder by name.

    From a transformers repository only the safetensors weights, config and tokenizer files are
    fetched; from a repository of GGUF files only the one of the quant type asked for (with no
    :QUANT, its Q4_K_M, else its first), every part of a split one. Files go into the hub cache
    (HF_HOME); an interrupted pull keeps the files it finished, and pulling again fetches the
    rest. Prints the model's folder or GGUF file; afterwards `--model MODEL` loads it, offline.
    A local file stays where it is: `--model NAME` then loads it, and `msa models rm NAME`
    forgets it (the file is kept).
    """
    from pathlib import Path

    from msa.models.hub_gguf import parse_ref

    from .output import quiet_or_note

    local = Path(model).expanduser()
    if local.exists() or (model.endswith(".gguf") and parse_ref(model) is None):
        _register(local, name, quiet)
        return
    if name is not None:
        raise typer.BadParameter(
            "only a local file is registered under a name", param_hint="--name"
        )
    from .pull import pull as pull_model

    print(pull_model(model, quiet=quiet, note=quiet_or_note(quiet)))


def _register(local, name: str | None, quiet: bool) -> None:
    """Register the local file or folder `local` under `name` (default: its file name)."""
    from msa.models.local_models import register_model
    from msa.models.registry import KNOWN_MODELS

    from ..engine.paths import registered_models_index
    from .output import quiet_or_note

    registered, replaced = register_model(
        registered_models_index(), local, name, reserved=set(KNOWN_MODELS)
    )
    verb = "registered again" if replaced else "registered"
    quiet_or_note(quiet)(f"{verb} {registered}: use it with --model {registered}")
    print(local.resolve())
