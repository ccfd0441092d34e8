"""A token embedding kept in its GGUF blocks: a lookup dequantizes only the rows it reads.

A vocabulary of 150K-260K tokens makes the embedding a large share of a small model: in fp32 it
is 4.4x the bytes of a Q8_0 table and 6.4x a Q5_0 one. Its rows are read a few at a time (the
tokens of a chunk), so they stay in the file's blocks and each lookup dequantizes its rows with
llama.cpp's own reference (gguf_blocks.dequantize_rows): the same values llama.cpp computes with.
A tied output head multiplies the same blocks (ggml_linear.py), or int8 rows of them where no
kernel reads their type.

State: `embed_tokens.blocks` (uint8 [vocab, bytes per row]) and `embed_tokens.ggml_type` (the
GGMLQuantizationType value, a 0-d tensor).
"""

from __future__ import annotations

import torch
from torch import nn

from .gguf_blocks import dequantize_rows


class QuantizedEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.register_buffer("blocks", torch.empty(0, dtype=torch.uint8))
        self.register_buffer("ggml_type", torch.tensor(0))
        # empty, in the output dtype: callers read a model's compute dtype from
        # `embed_tokens.weight.dtype`
        self.register_buffer("weight", torch.empty(0, dtype=dtype), persistent=False)

    def _load_from_state_dict(self, state_dict, prefix, *args):
        names = (prefix + "blocks", prefix + "ggml_type")
        if not all(n in state_dict for n in names):
            return super()._load_from_state_dict(state_dict, prefix, *args)
        self.blocks, self.ggml_type = (state_dict[n] for n in names)  # any shape: taken as is

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of `ids` [n], dequantized exactly: fp32 [n, dim]."""
        from gguf import GGMLQuantizationType

        type_name = GGMLQuantizationType(int(self.ggml_type)).name
        rows = self.blocks[ids.reshape(-1)].numpy()  # [n, bytes per row]
        return torch.from_numpy(dequantize_rows(rows, type_name, self.embedding_dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.rows(ids)
        return out.to(self.weight.dtype).view(*ids.shape, self.embedding_dim)


def swap_embedding_for_state(model: nn.Module, state: dict, dtype: torch.dtype) -> None:
    """Give `model` a QuantizedEmbedding when `state` holds its blocks."""
    if "embed_tokens.blocks" in state:
        old = model.embed_tokens
        model.embed_tokens = QuantizedEmbedding(old.num_embeddings, old.embedding_dim, dtype)
