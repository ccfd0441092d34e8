"""A Llama-family decoder (SmolLM2, Llama 3): GQA attention, SwiGLU MLP, RMSNorm, RoPE."""

from __future__ import annotations

import torch
from torch import nn

from .attention import attend
from .attention_plan import ModelAttention, resolve_settings
from .attention_settings import AttentionSettings
from .config import ModelConfig
from .forward import AttentionObserver, ForwardContext
from .fused_decode import FusedDecode, layer_spec, projections
from .ggml_linear import GgmlLinear, same_input_products
from .head_refine import refine_top
from .kv_cache import KVCache
from .layers import RMSNorm, RotaryEmbedding, apply_rope, embedding, silu_glu
from .msa_defaults import MsaDefaults, rule
from .quantize import Int4Linear, Int8Linear
from .rope_scaling import rotary_embedding


class Attention(nn.Module):
    fusable_projections = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}  # see fuse.py
    # the RMSNorms (q, k) a family's qk_norm applies to each head over D, one weight for every
    # head, and nothing else (Qwen3): the fused decode step computes those
    head_norms: tuple[str, ...] = ()

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.fused_sizes = None
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        d = self.head_dim
        qkv_bias, o_bias = self.biases(config)
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * d, bias=qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv_heads * d, bias=qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv_heads * d, bias=qkv_bias)
        self.o_proj = nn.Linear(self.n_heads * d, config.hidden_size, bias=o_bias)

    @staticmethod
    def biases(config: ModelConfig) -> tuple[bool, bool]:
        """Whether q/k/v and o have biases: both as `attention_bias` says in Llama (Qwen2:
        q/k/v only)."""
        return config.attention_bias, config.attention_bias

    def forward(self, x: torch.Tensor, ctx: ForwardContext, layer: int) -> torch.Tensor:
        t = x.shape[0]
        d = self.head_dim
        cos, sin = ctx.angles(layer)
        if self.fused_sizes is not None and type(self).qk_norm is Attention.qk_norm:
            # fused and no q/k norm: rotate q and k in one go
            qkv = self.qkv_proj(x)
            n_qk = (self.n_heads + self.n_kv_heads) * d
            qk = apply_rope(
                qkv[:, :n_qk].view(t, -1, d).transpose(0, 1), cos, sin
            )  # [Hq+Hkv, T, D]
            q, k = qk[: self.n_heads], qk[self.n_heads :]
            v = qkv[:, n_qk:].view(t, self.n_kv_heads, d).transpose(0, 1)
        else:
            if self.fused_sizes is None:
                q, k, v = same_input_products(x, (self.q_proj, self.k_proj, self.v_proj))
            else:
                q, k, v = self.qkv_proj(x).split(self.fused_sizes, dim=-1)
            q = q.view(t, self.n_heads, d).transpose(0, 1)  # q: [Hq, T, D]
            k = k.view(t, self.n_kv_heads, d).transpose(0, 1)  # k: [Hkv, T, D]
            v = v.view(t, self.n_kv_heads, d).transpose(0, 1)
            q, k = self.qk_norm(q, k)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = ctx.cache.write(layer, k, v, selective=True)  # [Hkv, start+T, D]
        out = attend(q, keys, values, ctx, layer)  # [Hq, T, D]
        return self.o_proj(out.transpose(0, 1).reshape(t, self.n_heads * d))

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [Hq, T, D], k [Hkv, T, D] before RoPE: none in Llama; Qwen3 and MiniMax normalize
        here."""
        return q, k


class MLP(nn.Module):
    fusable_projections = {"gate_up_proj": ("gate_proj", "up_proj")}  # see fuse.py

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.fused_sizes = None
        bias = config.mlp_bias
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_sizes is None:
            return self.down_proj(silu_glu(*same_input_products(x, (self.gate_proj, self.up_proj))))
        gate, up = self.gate_up_proj(x).split(self.fused_sizes, dim=-1)
        return self.down_proj(silu_glu(gate, up))


class Block(nn.Module):
    attention_class = Attention  # other families swap in their own attention and MLP
    mlp_class = MLP

    def __init__(self, config: ModelConfig, layer: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = self.attention_class(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = self.mlp_class(config)

    def forward(self, x: torch.Tensor, ctx: ForwardContext, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, layer)
        return x + self.mlp(self.post_attention_layernorm(x))

    def fused_spec(self) -> dict | None:
        """This layer as the fused decode step computes it (fused_decode.layer_spec), or None:
        Llama's own layers have that form, biases or not, and so do the families' layers that
        change nothing but which projections have biases (Qwen2) or add `head_norms` (Qwen3).
        Projections left unfused (parts in different formats, as in a GGUF Q4_K_M file) go to
        the step as their parts."""
        attn, mlp = self.self_attn, self.mlp
        if not isinstance(attn, Attention):  # (MiniMax-M3's attention is its own module)
            return None
        head_norms = [getattr(attn, name) for name in attn.head_norms]
        changes = {"biases"} | ({"__init__", "qk_norm", "head_norms"} if head_norms else set())
        if not (
            _changes_only(type(self), Block, {"attention_class", "mlp_class"})
            and _changes_only(type(attn), Attention, changes)
            and _changes_only(type(mlp), MLP, set())
        ):
            return None
        return layer_spec(
            self.input_layernorm, self.post_attention_layernorm, projections(attn, mlp), head_norms
        )


# what a class body holds besides what it defines
_CLASS_METADATA = frozenset(
    "__module__ __qualname__ __doc__ __firstlineno__ __static_attributes__".split()
)


def _changes_only(cls: type, base: type, names: set[str]) -> bool:
    """Whether `cls` is `base` or a subclass of it that defines nothing but `names`."""
    if not issubclass(cls, base):
        return False
    between = cls.__mro__[: cls.__mro__.index(base)]
    return all(set(vars(k)) <= _CLASS_METADATA | names for k in between)


class Transformer(nn.Module):
    block_class = Block  # the decoder layer, built as block_class(config, layer index)
    norm_offset = 0.0  # RMSNorm scales by weight + norm_offset (1: Gemma style)
    local_rope: RotaryEmbedding | None = None  # the local layers' RoPE, if not self.rope
    bf16_attention = False  # prefill's attention on bf16 products (loading.py sets it)

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            self.block_class(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, self.norm_offset)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = rotary_embedding(config)

        # the fused decode step (fused_decode.py), or why one-token forwards run per op; built
        # by prepare_decode, at the latest on the first one-token forward
        self.fused_decode: FusedDecode | None = None
        self.per_op_reason: str | None = None
        self.msa_defaults: MsaDefaults = rule(config)  # or its loader's calibration
        self._decode_prepared = False

    def new_cache(
        self, capacity: int = 0, settings: AttentionSettings | None = None, storage_dir=None
    ) -> KVCache:
        """An empty cache for this model (keys and values in files under `storage_dir` if given)."""
        settings = resolve_settings(settings, self.config, self.msa_defaults)
        c = self.config
        return KVCache(
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
            block_size=settings.block_size,
            dtype=self.embed_tokens.weight.dtype,
            capacity=capacity,
            settings=settings,
            storage_dir=storage_dir,
            rope=self.rope,
            model_attention=self.model_attention(),
        )

    def model_attention(self) -> ModelAttention:
        """What this model fixes about attention: its config's sliding windows, if any."""
        return ModelAttention(windows=self.config.layer_windows())

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, hidden] of `tokens` [T] entering the first layer."""
        return self.embed_tokens(tokens)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab] of the last layer's hidden states x [..., hidden]: fp32 where the
        head computes in fp32, else its top candidates recomputed in fp32 (head_refine.py)."""
        h = self.norm(x)
        head = self.lm_head
        if isinstance(head, GgmlLinear):  # the file's weights, logits in fp32 whatever the dtype
            h = h.float()
            if h.numel() != h.shape[-1]:
                return head.exact(h)  # many rows: an fp32 GEMM already
            # one row: int8 input as llama.cpp's, the top candidates redone in fp32 (head_refine)
            return refine_top(head(h), h, self.head_rows)
        logits = head(h)
        if isinstance(head, Int4Linear) or (
            isinstance(head, nn.Linear) and head.weight.dtype == torch.float32
        ):
            return logits.float()  # fp32 already (an int4 head keeps no rows to read back)
        return refine_top(logits, h, self.head_rows)

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows [n, hidden] of the output head for token ids [n], in fp32."""
        head = self.lm_head
        if self.config.tie_word_embeddings and hasattr(self.embed_tokens, "rows"):
            return self.embed_tokens.rows(ids)  # the GGUF blocks themselves
        if isinstance(head, GgmlLinear):
            return head.rows(ids)
        if isinstance(head, Int8Linear):
            return head.weight[ids].float() * head.scales[ids, None].float()
        return head.weight[ids].float()

    def prepare_decode(self) -> str | None:
        """Build the fused decode step now rather than at the first one-token forward. Returns
        None when one-token forwards run it, else why they run per op."""
        if not self._decode_prepared:
            specs = [block.fused_spec() for block in self.layers]
            built = FusedDecode.build(self, None if None in specs else specs)
            if isinstance(built, str):
                self.per_op_reason = built
            else:
                self.fused_decode = built
            self._decode_prepared = True
        return self.per_op_reason

    @torch.no_grad()  # not inference_mode: the caller's cache must stay writable outside forward
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        *,
        question_from: int | None = None,
        observer: AttentionObserver | None = None,
        all_logits: bool = False,
        fused: bool = True,
    ) -> torch.Tensor:
        """Run `tokens` [T] after the `cache.length` tokens already cached.

        `question_from`: where the question starts (a chunk from there shares the selection
        layer's blocks, ForwardContext); `observer`: sees each layer's queries (sources).
        Returns logits [T, vocab] with `all_logits`, else only the last token's [vocab]
        (prefill then skips the large vocabulary projection for every other token). A one-token
        forward runs the fused decode step where it can; `fused=False` keeps it per op.
        """
        start, count = cache.length, tokens.shape[0]
        if (
            fused
            and count == 1
            and observer is None
            and FusedDecode.fits(cache)
            and self.prepare_decode() is None
        ):
            cos, sin = self.rope.cos_sin_range(start, 1)  # [1, D]
            if self.local_rope is not None:  # the local layers' angles in a second row
                local_cos, local_sin = self.local_rope.cos_sin_range(start, 1)
                cos, sin = torch.cat([cos, local_cos]), torch.cat([sin, local_sin])
            x = self.embed(tokens)[0].contiguous()
            logits = self.logits(self.fused_decode.run(x, cos, sin, cache))
            return logits.float()[None] if all_logits else logits.float()
        ctx = ForwardContext.open(
            cache,
            self.rope,
            start,
            count,
            question_from=question_from,
            observer=observer,
            local_rope=self.local_rope,
            bf16_attention=self.bf16_attention,
        )
        x = self.embed(tokens)  # [T, hidden]
        for i, layer in enumerate(self.layers):
            x = layer(x, ctx, i)
        cache.advance(count)
        x = x if all_logits else x[-1]
        return self.logits(x).float()
