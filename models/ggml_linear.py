"""A Linear layer whose weights stay in a GGUF's own blocks (Q4_K, Q6_K, Q5_0, Q8_0), mapped
from the file: nothing converted or copied at load, every bit of the file's weights kept.

The products run on the C++ kernels of msa.kernels.ggml_blocks: for one row (decode) the input
quantized to int8 as llama.cpp does (its Q8_0 / Q8_K blocks) times the blocks in integers
(`exact` keeps an fp32 input); for more rows, dequantized tiles times an fp32
GEMM, the exact weights' to fp32 rounding. The faster products of more than one row (prefill)
are chosen by the loader (`choose_prefill_products`, compute dtype "auto" or "bf16"):
- "int8" (auto, on AVX-512 VNNI without AMX): each row as one row's product computes it, the
  input in int8 (`ggml_blocks.linear_int8`): decode's and llama.cpp's arithmetic, 1.4-1.7x the
  bf16 tiles on oneDNN's GEMM;
- "bf16" (auto on AMX, or elsewhere with AVX-512 BF16, or asked for): bf16 tiles of the weights
  times bf16-rounded inputs, summed in fp32 (`ggml_blocks.linear_bf16`), 2-4x the fp32 GEMM.
Where the kernels cannot be built, the weights are dequantized by the reference (gguf.quants)
at each call: slow, fp32.

State: `{module}.blocks` (uint8 [rows, bytes per row], a read-only view of the mapped file),
`{module}.ggml_type` (the GGMLQuantizationType value, 0-d) and optionally `{module}.row_ids`
(int64 [out]: output row i is row `row_ids[i]` of the blocks, how llama.cpp's q/k row order is
undone without a copy) and `{module}.bias`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from msa.kernels import ggml_blocks

from .gguf_blocks import dequantize_rows

SUFFIXES = ("blocks", "ggml_type", "row_ids")
# how a layer's products of many rows (prefill) run
EXACT, BF16, INT8 = "exact", "bf16", "int8"


def type_name(ggml_type: int) -> str:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(ggml_type).name


class GgmlLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("blocks", torch.empty(0, dtype=torch.uint8))
        self.register_buffer("ggml_type", torch.tensor(0))
        self.register_buffer("row_ids", ggml_blocks.NO_ROW_IDS)
        self.register_buffer("bias", torch.empty(out_features) if bias else None)
        self.type_id = 0
        self.prefill = EXACT  # how products of many rows run (choose_prefill_products)

    def _load_from_state_dict(self, state_dict, prefix, *args):
        if prefix + "blocks" not in state_dict:
            return super()._load_from_state_dict(state_dict, prefix, *args)
        self.blocks, self.ggml_type = (
            state_dict[prefix + "blocks"],
            state_dict[prefix + "ggml_type"],
        )
        self.row_ids = state_dict.get(prefix + "row_ids", ggml_blocks.NO_ROW_IDS)
        if self.bias is not None:
            self.bias = state_dict[prefix + "bias"]
        self.type_id = int(self.ggml_type)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x, exact=False)

    def exact(self, x: torch.Tensor) -> torch.Tensor:
        """The product with an fp32 input for one row too, and never on bf16 tiles: the output
        head's many-row logits (a decode step's one row takes the int8-input product and has
        its top candidates recomputed in fp32 from `rows`, Transformer.logits)."""
        return self._product(x, exact=True)

    def _product(self, x: torch.Tensor, exact: bool) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float().contiguous()  # [M, K]
        prefill = self.prefill if flat.shape[0] > 1 and not exact else EXACT
        if ggml_blocks.compiled_extension() is None:
            out = F.linear(flat, self.rows(torch.arange(self.out_features)))
        elif prefill == BF16:
            out = ggml_blocks.linear_bf16(flat, self.blocks, self.type_id, self.row_ids)
        elif prefill == INT8:
            out = ggml_blocks.linear_int8(flat, self.blocks, self.type_id, self.row_ids)
        else:
            out = ggml_blocks.linear(flat, self.blocks, self.type_id, self.row_ids, exact)
        return self._output(out, x)

    def _output(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The product `out` [M, out] fp32 of input x [..., in] as forward returns it."""
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The weights of output rows `ids` [n], dequantized exactly: fp32 [n, in_features]."""
        if self.row_ids.numel():
            ids = self.row_ids[ids]
        raw = self.blocks[ids].numpy()
        return torch.from_numpy(dequantize_rows(raw, type_name(self.type_id), self.in_features))


def same_input_products(x: torch.Tensor, layers) -> list[torch.Tensor]:
    """Each layer's product with x (a layer's q, k and v, or its gate and up): where every layer
    is a GgmlLinear that prefills with int8 inputs and x has more than one row, one call to the
    kernels (x quantized once a format, one parallel region: `ggml_blocks.linear_int8_parts`);
    otherwise layer by layer. The same values either way."""
    rows = x.numel() // x.shape[-1]
    if rows > 1 and all(isinstance(m, GgmlLinear) and m.prefill == INT8 for m in layers):
        flat = x.reshape(rows, -1).float().contiguous()
        outs = ggml_blocks.linear_int8_parts(
            flat, [(m.blocks, m.type_id, m.row_ids) for m in layers]
        )
        return [m._output(out, x) for m, out in zip(layers, outs)]
    return [m(x) for m in layers]


def choose_prefill_products(model: nn.Module, dtype_name: str) -> str:
    """Set how the GgmlLinear layers of `model`'s blocks multiply many rows (prefill), and return
    it: under compute dtype "auto", INT8 where the int8 GEMM is the fastest product here
    (AVX-512 VNNI without AMX: `ggml_blocks.int8_fast`), else BF16 where
    this CPU multiplies bf16 fast (AMX, or AVX-512 BF16 through oneDNN: `ggml_blocks.bf16_fast`);
    under "bf16", BF16 where fast; else, and under "fp32", EXACT. The output head stays exact:
    prefill asks it for one row (the last token's logits), and a model whose only such layer is
    its head (the embedded one) is left EXACT."""
    head = getattr(model, "lm_head", None)
    layers = [m for m in model.modules() if isinstance(m, GgmlLinear) and m is not head]
    chosen = EXACT
    if layers and dtype_name == "auto" and ggml_blocks.int8_fast():
        chosen = INT8
    elif layers and dtype_name in ("auto", "bf16") and ggml_blocks.bf16_fast():
        chosen = BF16
    for m in layers:
        m.prefill = chosen
    return chosen


def swap_ggml_for_state(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Replace each Linear whose blocks `state` holds by a GgmlLinear; returns their names."""
    names = []
    for name, m in list(model.named_modules()):
        if not isinstance(m, nn.Linear) or f"{name}.blocks" not in state:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, GgmlLinear(m.in_features, m.out_features, m.bias is not None))
        names.append(name)
    return names
