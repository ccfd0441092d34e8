"""Read a Hugging Face model directory: config.json, tokenizer.json and *.safetensors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .checkpoint import Checkpoint
from .config import ModelConfig
from .errors import ModelError
from .gguf_loader import file_digest
from .tokenizer import ChatTemplate, TextTokenizer

_SUPPORTED = {"llama"}


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {path}: {e}") from None


def _our_name(key: str) -> str:
    return key[len("model."):] if key.startswith("model.") else key


def _chat_template(folder: Path, tok_config: dict) -> str:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not template:
        raise ModelError(f"{folder} has no chat template (chat_template.jinja or tokenizer_config.json)")
    return template


def load_hf_dir(folder: Path, *, name: str | None = None) -> Checkpoint:
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    folder = Path(folder)
    raw = _read_json(folder / "config.json")
    if raw.get("model_type") not in _SUPPORTED:
        raise ModelError(f"{folder}: model_type {raw.get('model_type')!r} is not supported yet "
                         f"(supported: {', '.join(sorted(_SUPPORTED))})")
    config = ModelConfig.from_dict(raw)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder} holds no .safetensors weights")
    if not (folder / "tokenizer.json").is_file():
        raise ModelError(f"{folder} has no tokenizer.json")
    weights = {}
    digest = hashlib.sha256()
    for f in files:
        digest.update(file_digest(f).encode())
        weights.update({_our_name(k): v.float() for k, v in load_file(str(f)).items()})
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok_config = _read_json(folder / "tokenizer_config.json")
    gen_config = _read_json(folder / "generation_config.json")
    eos = gen_config.get("eos_token_id", config.eos_token_id)
    eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    if not eos_ids:
        raise ModelError(f"{folder}: no eos_token_id in config.json or generation_config.json")

    def token_text(value):
        return value.get("content", "") if isinstance(value, dict) else (value or "")

    template = ChatTemplate(_chat_template(folder, tok_config),
                            bos_token=token_text(tok_config.get("bos_token")),
                            eos_token=token_text(tok_config.get("eos_token")))
    return Checkpoint(name=name or folder.name, config=config, weights=weights,
                      tokenizer=TextTokenizer(tok, template, eos_ids),
                      digest=digest.hexdigest(), source=str(folder))
