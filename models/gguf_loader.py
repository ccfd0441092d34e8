"""Read a GGUF file (llama.cpp's format): config, dequantized weights, tokenizer, chat template.

Dequantizing and parsing the vocabulary take a few seconds, so the first load writes a
converted copy (safetensors weights + tokenizer.json + meta.json) into `converted_dir`, and
later loads map that copy instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .atomic_write import write_atomically
from .checkpoint import Checkpoint
from .config import ModelConfig
from .digests import file_digest, memo_dir
from .errors import ModelError
from .gguf_names import our_name, unpermute_rows
from .gguf_vocab import vocab_from_metadata
from .tokenizer import ChatTemplate, TextTokenizer

CONVERTED_FORMAT = 3  # 2: meta.json says how the file stores its layers' weights; 3: and the
# prompt's BOS, EOS and stop tokens (gguf_vocab.py)

_SUPPORTED_ARCHS = {"llama"}


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _config_from_metadata(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in _SUPPORTED_ARCHS:
        raise ModelError(
            f"GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(sorted(_SUPPORTED_ARCHS))})"
        )

    def key(name, default=None):
        return _field(reader, f"{arch}.{name}", default)

    n_heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    vocab = key("vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=n_heads,
        num_key_value_heads=int(key("attention.head_count_kv", n_heads)),
        head_dim=int(key("attention.key_length", hidden // n_heads)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position_embeddings=int(key("context_length", 4096)),
        tie_word_embeddings=not has_output,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
    )


def _stored_quantization(reader) -> str | None:
    """How the file stores its layers: "int4" when every matmul weight of every layer is Q4_1,
    our int4 format (such weights are used as they are, by default); else None (floats)."""
    from gguf import GGMLQuantizationType

    types = {
        t.tensor_type for t in reader.tensors if t.name.startswith("blk.") and len(t.shape) == 2
    }
    return "int4" if types == {GGMLQuantizationType.Q4_1} else None


def _weights_from_tensors(reader, config: ModelConfig) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    weights = {}
    for t in reader.tensors:
        name = our_name(t.name)
        try:
            w = dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ModelError(
                f"GGUF tensor {t.name} has type {t.tensor_type.name}, which msa cannot read"
            ) from None
        # a copy: F32 tensors come back as read-only views of the mapped file
        w = np.array(w, dtype=np.float32).reshape([int(s) for s in reversed(t.shape)])
        weights[name] = torch.from_numpy(unpermute_rows(name, w, config))
    return weights


def _tokenizer_from_metadata(reader) -> tuple[str, dict]:
    """The tokenizer.json text, and the meta.json entries of the prompt (gguf_vocab.py)."""
    vocab = vocab_from_metadata(
        {k: _field(reader, k) for k in reader.fields if k.startswith("tokenizer.")}
    )
    return vocab.tokenizer.to_str(), vocab.meta()


def _convert(path: Path, digest: str, out: Path) -> None:
    from gguf import GGUFReader
    from safetensors.torch import save_file

    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # the gguf library raises ValueError, struct errors, ...
        raise ModelError(f"{path} is not a readable GGUF file ({e})") from None
    config = _config_from_metadata(reader)
    weights = _weights_from_tensors(reader, config)
    tokenizer_json, prompt_meta = _tokenizer_from_metadata(reader)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "model.safetensors", lambda p: save_file(weights, str(p)))
    write_atomically(out / "tokenizer.json", lambda p: p.write_text(tokenizer_json))
    meta = {
        "format": CONVERTED_FORMAT,
        "digest": digest,
        "source": str(path),
        "config": config.to_dict(),
        **prompt_meta,
        "name": _field(reader, "general.name", path.stem),
        "stored_quantization": _stored_quantization(reader),
    }
    # meta.json last: its presence says the copy is complete.
    write_atomically(out / "meta.json", lambda p: p.write_text(json.dumps(meta)))


def load_gguf(
    path: Path,
    converted_root: Path | None,
    *,
    name: str | None = None,
    q4_1_as_int4: bool | None = False,
) -> Checkpoint:
    """Load a GGUF model, through a converted copy under `converted_root` when one is given.

    With `q4_1_as_int4`, Q4_1 tensors come straight from the file's blocks as int4 weights
    (`.weight/.scales/.mins`, see gguf_q4.py) and their fp32 copies are never read; None: when
    the file stores its layers in Q4_1 (`meta["stored_quantization"]` of the checkpoint says so).
    """
    import tempfile

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    digest = file_digest(path, memo_dir(converted_root))
    tmp = None
    if converted_root is None:
        tmp = tempfile.TemporaryDirectory(prefix="msa-model-")
        out = Path(tmp.name)
    else:
        out = Path(converted_root) / digest[:32]
    try:
        meta_path = out / "meta.json"
        meta = None
        if meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                meta = None
        if not meta or meta.get("format") != CONVERTED_FORMAT or meta.get("digest") != digest:
            _convert(path, digest, out)
            meta = json.loads(meta_path.read_text())
        config = ModelConfig.from_dict(meta["config"])
        stored = meta["stored_quantization"]
        if q4_1_as_int4 is None:
            q4_1_as_int4 = stored == "int4"
        weights = _read_weights(path, out / "model.safetensors", config, q4_1_as_int4)
        template = ChatTemplate.from_meta(meta)
        tokenizer = TextTokenizer.from_file(out / "tokenizer.json", template, meta["eos_ids"])
        return Checkpoint(
            name=name or meta["name"],
            config=config,
            weights=weights,
            tokenizer=tokenizer,
            digest=digest,
            source=str(path),
            meta={"stored_quantization": stored},
        )
    finally:
        if tmp is not None:
            tmp.cleanup()


def _read_weights(
    gguf_path: Path, converted: Path, config: ModelConfig, q4_1_as_int4: bool
) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    int4 = _q4_1_weights(gguf_path, converted.parent / Q4_1_COPY, config) if q4_1_as_int4 else {}
    with safe_open(str(converted), "pt") as f:
        weights = {
            k: f.get_tensor(k)
            for k in f.keys()
            if f"{k.removesuffix('.weight')}.scales" not in int4
        }
    return {**weights, **int4}


# Beside the converted copy: the file's Q4_1 blocks as int4 state, written at the first int4
# load. Reading them out of the GGUF means parsing all its metadata first (the tokenizer's
# 49K strings: 3.9 of a 4.5 s load of the embedded model); this file maps in a moment.
Q4_1_COPY = "model-q4_1.safetensors"


def _q4_1_weights(gguf_path: Path, copy: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The GGUF's Q4_1 matmul weights as int4 state (`.weight/.scales/.mins`), from `copy` when
    it is there, else from the file (then kept in `copy`)."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import save_file

    if copy.is_file():
        try:
            with safe_open(str(copy), "pt") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        except (OSError, SafetensorError):
            pass  # unreadable: made again below
    from gguf import GGUFReader

    from .gguf_q4 import q4_1_state

    state = q4_1_state(GGUFReader(str(gguf_path)), config)
    try:
        write_atomically(
            copy, lambda p: save_file({k: v.contiguous() for k, v in state.items()}, str(p))
        )
    except OSError:
        pass  # a read-only cache: parse again next time
    return state
