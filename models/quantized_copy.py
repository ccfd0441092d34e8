"""Quantized copies of a model, as `msa quantize` writes them: one folder per copy.

    <root>/<base>-<mode>/model.safetensors   quantized Linear weights (`.weight/.scales[/.mins]`,
                                             see quantize.py) and every other tensor in fp32;
                                             mode and group size in the file's metadata
                        /tokenizer.json
                        /meta.json           config, chat template, stop ids, base model, digest

meta.json is written last, so a folder without it is an interrupted write: never listed or
loaded, and replaced by the next `msa quantize`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .architectures import config_class
from .checkpoint import Checkpoint
from .disk_space import check_free_space
from .errors import DiskError, ModelError, disk_error
from .private_files import FILE_MODE, private_dir, tighten
from .quantize import DEFAULT_GROUP_SIZE, MODES, check_mode
from .tokenizer import ChatTemplate, TextTokenizer

FORMAT = 1


def copy_name(base: str, mode: str) -> str:
    return f"{base}-{mode}"


def write_quantized_copy(
    root: Path,
    base_name: str,
    ckpt: Checkpoint,
    state: dict[str, torch.Tensor],
    mode: str,
    group_size: int = DEFAULT_GROUP_SIZE,
) -> Path:
    """Write `state` (quantized and floating tensors by our names) with `ckpt`'s config and
    tokenizer as `<root>/<base>-<mode>`, replacing an older copy only once the new one is whole."""
    from safetensors import SafetensorError

    root = Path(root)
    final = root / copy_name(base_name, mode)
    doing = f"writing {final}"
    needed = sum(t.numel() * t.element_size() for t in state.values())
    check_free_space(root, needed, doing)  # tensors' bytes; the rest is small
    try:
        private_dir(root)
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    except OSError as e:
        raise disk_error(e, doing) from None
    try:
        try:
            save_quantized(work / "model.safetensors", state, mode, group_size)
        except SafetensorError as e:  # how safetensors reports a full disk
            raise DiskError(f"{doing}: {e}") from None
        (work / "tokenizer.json").write_text(ckpt.tokenizer.tokenizer.to_str())
        template = ckpt.tokenizer.template
        digest = hashlib.sha256(f"{ckpt.digest}:{mode}:{group_size}".encode()).hexdigest()
        meta = {
            "format": FORMAT,
            "name": final.name,
            "base": base_name,
            "source": ckpt.source,
            "quantization": mode,
            "group_size": group_size,
            "digest": digest,
            "config": ckpt.config.to_dict(),
            **template.to_meta(),
            "eos_ids": list(ckpt.tokenizer.eos_ids),
        }
        (work / "meta.json").write_text(json.dumps(meta))
        for written in work.iterdir():  # 0600 whatever the umask, as every file of msa's
            tighten(written, FILE_MODE)
        old = None
        if final.exists():
            old = root / f".{final.name}.old.{os.getpid()}"
            os.replace(final, old)
        os.replace(work, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise disk_error(e, doing) from None
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return final


def load_quantized_copy(folder: Path) -> Checkpoint:
    folder = Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT}")
        config = config_class(meta["config"]["architecture"]).from_dict(meta["config"])
        state, mode, group_size = load_quantized(folder / "model.safetensors")
        template = ChatTemplate.from_meta(meta)
        tokenizer = TextTokenizer.from_file(folder / "tokenizer.json", template, meta["eos_ids"])
    except (
        Exception
    ) as e:  # missing files, bad JSON, a damaged safetensors file (its own error type)
        raise ModelError(
            f"{folder} is not a readable quantized copy ({e}); write it again with msa quantize"
        ) from None
    return Checkpoint(
        name=meta["name"],
        config=config,
        weights=state,
        tokenizer=tokenizer,
        digest=meta["digest"],
        source=str(folder),
        meta={"quantization": mode, "group_size": group_size, "base": meta["base"]},
    )


def save_quantized(
    path, state: dict[str, torch.Tensor], mode: str, group_size: int = DEFAULT_GROUP_SIZE
) -> None:
    from safetensors.torch import save_file

    check_mode(mode)
    meta = {"msa.quantization": mode, "msa.group_size": str(group_size if mode == "int4" else 0)}
    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata=meta)


def load_quantized(path) -> tuple[dict[str, torch.Tensor], str, int]:
    """(state, mode, group size) of a file written by `save_quantized`."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}
    if meta.get("msa.quantization") not in MODES:
        raise ValueError(f"{path} records no quantization mode in its metadata")
    return state, meta["msa.quantization"], int(meta["msa.group_size"])
