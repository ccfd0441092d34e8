"""Read a GGUF file (llama.cpp's format): config, weights, tokenizer, chat template.

Reading the metadata (gguf_header.py) and building the tokenizer from its vocabulary takes a
second or more on a real file, so the first load writes a small converted copy into
`converted_dir`: tokenizer.json and meta.json (the config as a Hugging Face dict, the tensor
index, the chat template). Every load then maps the GGUF (gguf_tensors.py): its Q4_K, Q6_K,
Q5_0 and Q8_0 tensors (a Q4_K_M file's) stay in their mapped blocks, other types are converted
one tensor at a time; the only weights kept are the int8 roundings of tensors of other types,
where they take no more room than the GGUF.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .architectures import config_class
from .atomic_write import write_atomically
from .checkpoint import Checkpoint
from .config import ModelConfig
from .digests import file_digest, memo_dir
from .disk_space import check_free_space
from .errors import ModelError, disk_error
from .gguf_config import check_against_tensors, hf_config_dict
from .gguf_header import GgufHeader, read_tensor
from .gguf_split import model_parts, read_model_header
from .gguf_tensors import (
    check_types,
    gguf_state,
    index_from_json,
    index_to_json,
    quantization_label,
    tensor_index,
)
from .gguf_vocab import vocab_from_metadata
from .kernel_copy import KernelCopy
from .tokenizer import ChatTemplate, TextTokenizer

CONVERTED_FORMAT = 5  # 4: no weights copy; meta.json has the tensor index, the HF config
# and the prompt's BOS, EOS and stop tokens (gguf_vocab.py); 5: Q4_K/Q6_K/Q5_0/Q8_0 tensors
# stay in the GGUF's blocks, so an older int8 copy (of those) is dropped
INT8_COPY = "int8.safetensors"  # the int8 roundings of tensors of other types (Int8Copy)


def _config(hf_config: dict) -> ModelConfig:
    try:
        return config_class(hf_config["model_type"]).from_dict(hf_config)
    except (TypeError, ValueError) as e:  # the config's own checks (heads by KV heads, ...)
        raise ModelError(f"the GGUF file's metadata: {e}") from None


def _hf_config(header: GgufHeader) -> dict:
    tensors = {t.name: tuple(reversed(t.shape)) for t in header.tensors}

    def read_floats(name: str) -> list[float]:
        return np.asarray(read_tensor(header, name), dtype=np.float32).ravel().tolist()

    d = hf_config_dict(header.fields.get, tensors, read_floats)
    check_against_tensors(d, header.fields["general.architecture"], tensors)
    return d


def _tokenizer_from_metadata(header: GgufHeader) -> tuple[str, dict]:
    """The tokenizer.json text, and the meta.json entries of the prompt (gguf_vocab.py)."""
    try:
        vocab = vocab_from_metadata(
            {k: v for k, v in header.fields.items() if k.startswith("tokenizer.")}
        )
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - `tokenizers` reports a bad vocabulary as Exception
        reason = " ".join(str(e).split())  # its messages run over several lines
        raise ModelError(f"the GGUF file's vocabulary cannot be read ({reason})") from None
    return vocab.tokenizer.to_str(), vocab.meta()


def _convert(path: Path, digest: str, out: Path) -> None:
    """Write the small part of a converted copy: meta.json (config, tensor index, chat template)
    and tokenizer.json. The weights are read from the GGUF itself at each load."""
    header = read_model_header(path)  # ModelError for a file that is not a GGUF
    index = tensor_index(header)
    check_types(index)  # before any other work
    hf_config = _hf_config(header)
    _config(hf_config)  # its checks, before the tokenizer is read
    tokenizer_json, prompt_meta = _tokenizer_from_metadata(header)
    meta = {
        "format": CONVERTED_FORMAT,
        "digest": digest,
        "source": str(path),
        "architecture": header.fields.get("general.architecture"),
        "config": hf_config,
        "tensors": index_to_json(index),
        **prompt_meta,
        "name": header.fields.get("general.name", path.stem),
    }
    meta_json = json.dumps(meta)
    doing = f"converting {path.name} into {out}"
    check_free_space(out, len(tokenizer_json.encode()) + len(meta_json.encode()), doing)
    try:
        write_atomically(out / "tokenizer.json", lambda p: p.write_text(tokenizer_json))
        # meta.json last: its presence says the copy is complete.
        write_atomically(out / "meta.json", lambda p: p.write_text(meta_json))
    except OSError as e:  # each file is whole or absent: the next start converts again
        raise disk_error(e, doing) from None


def _digest(parts: list[Path], memo: Path | None) -> str:
    """The model's identity: its file's digest, or for a split GGUF that of its parts' digests."""
    digests = [file_digest(p, memo) for p in parts]
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256(" ".join(digests).encode()).hexdigest()


def load_gguf(
    path: Path,
    converted_root: Path | None,
    *,
    name: str | None = None,
    quant: str | None = None,
    kernel_copy: bool = False,
) -> Checkpoint:
    """Load a GGUF model (one file, or the first part of a split one: gguf_split.py), its
    tokenizer and tensor index through a converted copy under `converted_root` when one is
    given, its weights from the file (gguf_tensors.py) for `quant`:
    None (as stored: Q4_K/Q6_K/Q5_0/Q8_0 in their blocks, Q4_0/Q4_1 int4, other quantized
    types int8, floats as floats), "int8", "int4" or "none" (floating point).
    `meta["quantization"]` of the checkpoint names the result (gguf_tensors.quantization_label:
    "Q4_K+Q5_0+Q6_K+Q8_0", "int4", "int4+int8"... or None). With `kernel_copy` and a converted
    copy, the int4 layers come in kernel form from their kept copy when it matches
    (kernel_copy.py), and `meta["kernel_copy"]` is that KernelCopy, to `keep` the built model's
    when it did not; fused models only (the copy holds fused layers)."""
    import tempfile

    path = Path(path)
    missing = [p for p in model_parts(path) if not p.is_file()]
    if missing:
        raise ModelError(f"model file not found: {missing[0]}")
    parts = model_parts(path)
    digest = _digest(parts, memo_dir(converted_root))
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
            (out / INT8_COPY).unlink(missing_ok=True)  # an older format's roundings
            meta = json.loads(meta_path.read_text())
        config = _config(meta["config"])
        index = index_from_json(meta["tensors"])
        check_types(index)
        copy = None if tmp is not None else out / INT8_COPY
        kernels = KernelCopy.open(out, digest, quant) if kernel_copy and tmp is None else None
        kept = kernels.tensors if kernels is not None else None
        weights = gguf_state(
            parts, index, config, meta["architecture"], quant, copy, int4_kept=kept is not None
        )
        weights |= kept or {}
        template = ChatTemplate.from_meta(meta)
        tokenizer = TextTokenizer.from_file(out / "tokenizer.json", template, meta["eos_ids"])
        return Checkpoint(
            name=name or meta["name"],
            config=config,
            weights=weights,
            tokenizer=tokenizer,
            digest=digest,
            source=str(path),
            meta={"quantization": quantization_label(weights), "kernel_copy": kernels},
        )
    finally:
        if tmp is not None:
            tmp.cleanup()
