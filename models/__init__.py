"""msa.models: model configs, loaders (GGUF, safetensors), modules, tokenizer, KV cache.

Names are imported on first use, so `msa.models.errors` can be used without loading torch.
"""

import importlib

_EXPORTS = {
    "ModelConfig": "config",
    "KVCache": "kv_cache",
    "Transformer": "llama",
    "LoadedModel": "loading",
    "load_model": "loading",
    "DEFAULT_MODEL": "registry",
    "KNOWN_MODELS": "registry",
    "resolve": "registry",
    "MsaError": "errors",
    "InputError": "errors",
    "ModelError": "errors",
    "InputTooLongError": "errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'msa.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
