"""Read a Hugging Face model directory: config.json, tokenizer.json and *.safetensors."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from .architectures import ARCHITECTURES, config_class
from .checkpoint import Checkpoint
from .config_values import check_config_values, check_shapes
from .digests import file_digest
from .errors import ModelError
from .fp8 import dequantize_fp8
from .phi3 import split_fused_projections
from .tokenizer import ChatTemplate, TextTokenizer

# Checkpoint key -> ours, per model_type: regex substitutions applied in order.
_EXPERTS = [
    (r"\.block_sparse_moe\.", ".mlp."),
    (r"\.experts\.(\d+)\.w1\.", r".experts.\1.gate_proj."),
    (r"\.experts\.(\d+)\.w3\.", r".experts.\1.up_proj."),
    (r"\.experts\.(\d+)\.w2\.", r".experts.\1.down_proj."),
]
NAME_MAPS = {
    "llama": [(r"^model\.", "")],
    "qwen3": [(r"^model\.", "")],
    "qwen2": [(r"^model\.", "")],
    "mistral": [(r"^model\.", "")],
    "phi3": [(r"^model\.", "")],
    "minimax_m2": [(r"^model\.", ""), *_EXPERTS],
    "gemma2": [(r"^model\.", "")],
    "gemma3_text": [(r"^model\.", "")],
    # Gemma3ForConditionalGeneration: model.language_model.* (transformers 5) or
    # language_model.model.* (transformers 4)
    "gemma3": [(r"^(model\.language_model|language_model\.model)\.", "")],
    "minimax_m3_vl": [
        (r"^language_model\.model\.", ""),
        (r"^language_model\.lm_head\.", "lm_head."),
        *_EXPERTS,
        (r"\.self_attn\.index_(q|k)_(proj|norm)\.", r".self_attn.indexer.\1_\2."),
    ],
}
# model_type -> (config, weights by our names) -> the weights as our modules name them
SPLITS = {"phi3": split_fused_projections}
# Checkpoint keys that are not the text model we run: multi-token-prediction heads, M3's vision
# side.
SKIPPED = {
    "minimax_m2": r"(^|\.)mtp\.",
    "gemma3": r"^(model\.)?(vision_tower|multi_modal_projector)\.",
    "minimax_m3_vl": r"^(vision_tower|multi_modal_projector|patch_merge_mlp)\.|(^|\.)mtp\.",
}
LAYER_NAME = re.compile(r"^layers\.(\d+)\.")


def our_name(model_type: str, key: str) -> str:
    for pattern, repl in NAME_MAPS[model_type]:
        key = re.sub(pattern, repl, key)
    return key


def _read_weights(
    files: list[Path], model_type: str, config, block: tuple[int, int]
) -> tuple[dict, list[str]]:
    """Weights by our names, FP8 ones dequantized; and the checkpoint keys skipped."""
    from safetensors import SafetensorError, safe_open

    skip = re.compile(SKIPPED[model_type]) if model_type in SKIPPED else None
    raw, skipped = {}, []
    for f in files:
        try:
            with safe_open(str(f), "pt") as st:  # memory-mapped: one tensor at a time
                for key in st.keys():
                    name = our_name(model_type, key)
                    layer = LAYER_NAME.match(name)
                    if (skip and skip.search(key)) or (
                        layer and int(layer.group(1)) >= config.num_hidden_layers
                    ):
                        skipped.append(key)  # MTP layers sit past the last decoder layer
                        continue
                    raw[name] = st.get_tensor(key)
        except (SafetensorError, OSError) as e:
            raise ModelError(f"{f} is not a readable safetensors file ({e})") from None
    weights = {}
    for name, t in raw.items():
        if name.endswith(".weight_scale_inv"):
            continue
        scale = raw.get(name + "_scale_inv")
        weights[name] = dequantize_fp8(t, scale, block) if scale is not None else t.float()
    return weights, skipped


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {path}: {e}") from None


def _chat_template(folder: Path, tok_config: dict) -> str:
    """The model's chat template; "" for none (a base model: a plain prompt, see ChatTemplate)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template or ""


def load_hf_dir(
    folder: Path, *, name: str | None = None, digest_memo: Path | None = None
) -> Checkpoint:
    folder = Path(folder)
    raw = _read_json(folder / "config.json")
    if not isinstance(raw, dict):
        raise ModelError(f"{folder}/config.json is not a JSON object")
    check_config_values(raw, f"{folder}/config.json")
    model_type = raw.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ModelError(
            f"{folder}: model_type {model_type!r} is not supported yet "
            f"(supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    try:
        config = config_class(model_type).from_dict(raw)
    except (TypeError, ValueError) as e:
        raise ModelError(f"{folder}/config.json: {e}") from None
    quant = raw.get("quantization_config") or {}
    block = tuple(quant.get("weight_block_size") or (128, 128))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder} holds no .safetensors weights")
    if not (folder / "tokenizer.json").is_file():
        raise ModelError(f"{folder} has no tokenizer.json")
    # the weights and the config that says how they compute (a RoPE scaling edited into
    # config.json changes every K/V the prefix cache keeps)
    digest = hashlib.sha256(json.dumps(raw, sort_keys=True).encode())
    for f in files:
        digest.update(file_digest(f, digest_memo).encode())
    weights, skipped = _read_weights(files, model_type, config, block)
    check_shapes(config, weights, str(folder))
    if model_type in SPLITS:
        weights = SPLITS[model_type](config, weights)
    tok_config = _read_json(folder / "tokenizer_config.json")
    gen_config = _read_json(folder / "generation_config.json")
    eos = gen_config.get("eos_token_id", config.eos_token_id)
    eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    if not eos_ids:
        raise ModelError(f"{folder}: no eos_token_id in config.json or generation_config.json")

    def token_text(value):
        return value.get("content", "") if isinstance(value, dict) else (value or "")

    source = _chat_template(folder, tok_config)
    template = ChatTemplate(
        source,
        bos_token=token_text(tok_config.get("bos_token")),
        eos_token=token_text(tok_config.get("eos_token")),
        # a template says where BOS goes; a plain prompt starts with it where the tokenizer would
        add_bos=not source and bool(tok_config.get("add_bos_token", False)),
    )
    return Checkpoint(
        name=name or folder.name,
        config=config,
        weights=weights,
        tokenizer=TextTokenizer.from_file(folder / "tokenizer.json", template, eos_ids),
        digest=digest.hexdigest(),
        source=str(folder),
        meta={"skipped": skipped},
    )
