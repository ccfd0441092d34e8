// One decode step (one new token) through a stack of pre-norm GQA decoder layers, on the CPU,
// in one call: RMSNorm -> QKV (+ biases) -> (per-head q/k RMSNorm, q scale) -> rotate-half RoPE
// (the layer kind's angles) -> append K/V (fp32, fp16 or bf16 stores; int8 K/V rounded to their
// grid, kv_rows.h) -> attention (dense, over a sliding window, or MSA: block selection over the
// cache's summaries, then the selected blocks; logits soft-capped where asked) -> O -> (RMSNorm)
// -> residual -> RMSNorm -> fused gate/up -> SiLU- or GELU(tanh)-GLU -> down -> (RMSNorm) ->
// residual, layer after layer. Llama's layers and Gemma 2/3's are both this: Gemma's adds the
// norms in parentheses, GELU and a q scale (its (1 + w) norms come as their weights plus one).
//
// Why: a decode step of a small model is ~30 layers x ~15 small ops, and from Python each op
// costs more in dispatch than in arithmetic (the embedded model: ~17 ms a step, of which the
// weight products are ~4 ms). Here the products still go to PyTorch's own kernels (fp32 `mv`,
// `_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`); everything between them is a loop
// over a few hundred floats. The definition this must match is `decoder_step_reference` in
// decoder_step_reference.py.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include "attend_rows.h"
#include "ggml_blocks.h"
#include "kv_rows.h"
#include "select_index.h"

namespace {

enum Kind : int64_t { FP32 = 0, INT8 = 1, INT4 = 2, GGML = 3 };

// A linear map y = W x (+ bias) in one of four weight formats (see quantize.py for the int
// formats, ggml_blocks.h for a GGUF's blocks).
struct Linear {
  int64_t kind = FP32;
  at::Tensor a;       // fp32 weight [N, K] | int8 weight [N, K] | int4 packed weight | blocks [R, bytes]
  at::Tensor b;       // -                  | bf16 scales [N]    | bf16 scales_zeros [K/g, N, 2] | row ids
  int64_t group = 0;  // int4 group size | GGML type
  at::Tensor bias;    // fp32 [N], or undefined: none (Qwen2's q/k/v, Llama's attention_bias)
  int64_t in = 0, out = 0;

  // GGUF blocks: the matrix as a part of a matvec writing to y.
  ggml_blocks::MatvecPart ggml_part(float* y) const {
    return {group, a.data_ptr<uint8_t>(), ggml_blocks::bytes_per_row(group, in),
            b.numel() > 0 ? b.data_ptr<int64_t>() : nullptr, out, y};
  }

  void add_bias(float* y) const {
    if (!bias.defined()) return;
    const float* bp = bias.data_ptr<float>();
    for (int64_t i = 0; i < out; ++i) y[i] += bp[i];
  }

  // y[0..out) = W x[0..in) (+ bias, in fp32 as the per-op modules add it); the int kernels
  // take bf16 activations and give bf16 back; GGUF blocks take x quantized to int8 (ggml_blocks.h).
  void apply(const float* x, float* y) const {
    if (kind == GGML) {
      const ggml_blocks::MatvecPart part = ggml_part(y);
      ggml_blocks::matvec_parts(&part, 1, in, x);
    } else if (kind == FP32) {
      at::Tensor xt = at::from_blob(const_cast<float*>(x), {in}, at::kFloat);
      at::Tensor yt = at::from_blob(y, {out}, at::kFloat);
      at::mv_out(yt, a, xt);
    } else {
      at::Tensor xb = at::empty({1, in}, at::kBFloat16);
      auto* xp = xb.data_ptr<at::BFloat16>();
      for (int64_t i = 0; i < in; ++i) xp[i] = at::BFloat16(x[i]);
      at::Tensor yb =
          kind == INT8 ? at::_weight_int8pack_mm(xb, a, b) : at::_weight_int4pack_mm_for_cpu(xb, a, group, b);
      const auto* yp = yb.data_ptr<at::BFloat16>();
      for (int64_t i = 0; i < out; ++i) y[i] = static_cast<float>(yp[i]);
    }
    add_bias(y);
  }
};

// Products that read the same input and write side by side: one fused linear (q, k, v rows in
// one matrix), or its parts each with its own format (a GGUF Q4_K_M file keeps q and k in one
// type, v in another: no single matrix holds them).
struct LinearGroup {
  std::vector<Linear> parts;

  // Parts all in GGUF blocks run as one matvec (ggml_blocks::matvec_parts: one parallel region
  // for the group, x quantized once); others one after another.
  void apply(const float* x, float* y) const {
    const bool blocks = std::all_of(parts.begin(), parts.end(), [](const Linear& p) { return p.kind == GGML; });
    if (blocks && parts.size() > 1) {
      std::vector<ggml_blocks::MatvecPart> matrices;
      float* out = y;
      for (const Linear& part : parts) {
        matrices.push_back(part.ggml_part(out));
        out += part.out;
      }
      ggml_blocks::matvec_parts(matrices.data(), static_cast<int64_t>(matrices.size()), parts[0].in, x);
      for (const Linear& part : parts) {
        part.add_bias(y);
        y += part.out;
      }
      return;
    }
    for (const Linear& part : parts) {
      part.apply(x, y);
      y += part.out;
    }
  }
};

struct Layer {
  at::Tensor norm_in, norm_post;  // fp32 [hidden]
  at::Tensor q_norm, k_norm;      // fp32 [D], one for every head, or undefined: none (Qwen3's)
  // fp32 [hidden] applied to the attention's and the MLP's outputs before their residual adds,
  // or undefined: none (Gemma's post-attention and post-feedforward norms)
  at::Tensor attn_out_norm, mlp_out_norm;
  float q_scale = 1.f;  // q times this before RoPE (Gemma: sqrt(D / query_pre_attn_scalar))
  int64_t act = 0;      // the GLU's activation of the gate: SILU or GELU_TANH
  bool torch_norms = false;  // norms (and GELU) by PyTorch's ops, as the per-op path's Gemma layers
  LinearGroup qkv, gate_up;
  Linear o, down;
};

enum Activation : int64_t { SILU = 0, GELU_TANH = 1 };

// GELU with the tanh approximation, as PyTorch's gelu(approximate="tanh") writes it.
inline float gelu_tanh(float x) {
  const float beta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);
  const float cube = x * x * x;
  const float inner = beta * (x + 0.044715f * cube);
  return 0.5f * x * (1.f + std::tanh(inner));
}

constexpr int64_t NEVER = int64_t{1} << 62;  // a position no input reaches (decoder_step.py's NEVER)

// How the cache's attention reads it: decoder_step.py's StepSettings (msa.models' AttentionPlan
// resolved for a cache), field by field. selection_layer: the layer whose blocks the layers after
// it read (none: each selects its own); windows: per layer, its sliding window (none, or past the
// list: a global layer); softcap: of the attention logits (none: not capped); dense_layers: the
// first layers, which read every earlier key whatever the position.
struct Settings {
  int64_t sparse_from = NEVER, bounded_from = NEVER, block_size = 64, topk = 8, local_blocks = 1, sink_blocks = 1;
  int64_t dense_layers = 0;
  std::optional<int64_t> selection_layer;
  std::vector<std::optional<int64_t>> windows;
  std::optional<double> softcap;

  // layer's sliding window, 0 for a global layer
  int64_t window(size_t layer) const { return layer < windows.size() ? windows[layer].value_or(0) : 0; }
};

// The cache a step reads and writes, per layer: the K and V stores [Hkv, cap, D] (fp32, fp16 or
// bf16; int8 K/V: fp32) and int8 K/V's scale stores [Hkv, cap] (none: not int8); for MSA's
// selection by content, the summaries [L, Hkv, >= full blocks, 2, D] and `absent` bool
// [L, n_marked]: the blocks not in the stores yet, which the step asks for instead of reading.
struct Cache {
  std::vector<at::Tensor> keys, values, key_scales, value_scales;
  at::Tensor summaries, absent;
};

// MSA's selection by the stored index instead of the summaries (models/index_selection.py): per
// layer its codes, scales and means as kv_index.py keeps them (empty where the layer has none),
// the first `tokens` indexed; top_p: its mass budget (none: top-k). No layers: by the summaries.
struct Index {
  std::vector<at::Tensor> codes, scales, means;
  int64_t tokens = 0;
  std::optional<double> top_p;
};

// The answer's rules (msa_decode.py): per layer, the blocks an MSA layer reads besides its own
// choice where they lie before its local window (ascending; no lists: none); peak_weight: the
// least share of a query head's attention on one token for the step to report the blocks that
// token leads to (none: no peaks are looked for).
struct Answer {
  std::vector<std::vector<int64_t>> blocks;
  std::optional<double> peak_weight;
};

// The blocks one KV head reads: ascending ids, the first n_far of them before the local window.
struct Selection {
  std::vector<int64_t> blocks;
  int64_t n_far = 0;
  std::vector<int64_t> ranked;  // its top-k far blocks, best first (empty: every candidate taken)
};

// What a step did. stopped_at: the layer that selected `missing`, blocks that `absent` marks
// (none: every layer ran); shared: the selection layer's blocks once it has selected, for the
// layers after it (pass it back to resume); followed: per layer, the blocks after the far blocks
// on whose last token a query head's attention peaked with at least `peak_weight` of it
// (msa_decode.blocks_after_peaks), copied: the far blocks past the sink on one of whose tokens
// it peaked so (blocks_copied_from), ascending, for the layers that ran (the others: empty).
struct StepResult {
  std::optional<int64_t> stopped_at;
  std::vector<int64_t> missing;
  std::optional<Selection> shared;
  std::vector<std::vector<int64_t>> followed, copied;
};

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

// RMSNorm of `rows` rows of n as msa.models' RMSNorm computes a norm with an offset, op by op:
// the mean of squares and its rsqrt by PyTorch's own kernels (their sums' order, so the same
// bits), then (x * r) * w. Why: a GGUF's products quantize their input to int8, where one last
// bit of difference can move a value to the next step (and Gemma's large norm weights make that
// step large).
void rms_norm_as_torch(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  at::Tensor xt = at::from_blob(const_cast<float*>(x), {rows, n}, at::kFloat);
  const at::Tensor r = at::rsqrt(at::pow(xt, 2).mean(-1, true) + static_cast<double>(eps));
  const float* rp = r.data_ptr<float>();
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < n; ++i) y[row * n + i] = x[row * n + i] * rp[row] * w[i];
}

// Rotate-half RoPE of `heads` vectors of width d by angles with cos, sin [d] (sign -1: back).
void rope(float* x, int64_t heads, int64_t d, const float* cos, const float* sin, float sign = 1.f) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - sign * b * sin[i];
      v[i + half] = b * cos[i + half] + sign * a * sin[i + half];
    }
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// e^x for the softmax's x <= 0, in a form the compiler vectorizes (std::exp is a scalar call):
// x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial to r^6 (relative error < 2e-7).
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.f);
  const float n = std::floor(x * 1.44269504f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float e = 1.f / 720.f;
  e = e * r + 1.f / 120.f;
  e = e * r + 1.f / 24.f;
  e = e * r + 1.f / 6.f;
  e = e * r + 0.5f;
  e = e * r + 1.f;
  e = e * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return e * scale;
}

// A run of cached tokens that one query reads with one rotation: tokens [start, start + len) of
// a KV head, the query counter-rotated by `shift` tokens first (0: as it is).
struct Segment {
  int64_t start, len, shift;
};

// The softmax state of G query heads over part of the tokens: running max m, sum l, and the
// unnormalized output o [G, D]; parts of one KV head merge by log-sum-exp. peak: each head's
// token (a row of the stores) whose logit is m, the first such.
struct Partial {
  std::vector<float> m, l, o;
  std::vector<int64_t> peak;
};

// The angles of the shifts a token's segments are read at: for each distinct nonzero shift s,
// cos and sin of s * inv_freq, as rope() takes them ([D], each half the same). Computed once a
// layer for all its KV heads, which mostly read the same blocks (a step at 32K tokens of the 8B
// shape spent 3% of its time in sincos, each head computing its own).
class Rotations {
 public:
  Rotations(const std::vector<std::vector<Segment>>& segs, int64_t d, const double* inv_freq) : d_(d) {
    for (const auto& head : segs)
      for (const Segment& seg : head)
        if (seg.shift != 0) shifts_.push_back(seg.shift);
    std::sort(shifts_.begin(), shifts_.end());
    shifts_.erase(std::unique(shifts_.begin(), shifts_.end()), shifts_.end());
    cos_.resize(shifts_.size() * d);
    sin_.resize(shifts_.size() * d);
    const int64_t half = d / 2;
    for (size_t i = 0; i < shifts_.size(); ++i)
      for (int64_t c = 0; c < half; ++c) {
        const double a = static_cast<double>(shifts_[i]) * inv_freq[c];
        cos_[i * d + c] = cos_[i * d + c + half] = static_cast<float>(std::cos(a));
        sin_[i * d + c] = sin_[i * d + c + half] = static_cast<float>(std::sin(a));
      }
  }

  // q [G, D] rotated by -shift into `out`.
  void rotate_back(const float* q, int64_t g, int64_t shift, float* out) const {
    const size_t i = std::lower_bound(shifts_.begin(), shifts_.end(), shift) - shifts_.begin();
    std::copy(q, q + g * d_, out);
    rope(out, g, d_, cos_.data() + i * d_, sin_.data() + i * d_, -1.f);
  }

 private:
  int64_t d_;
  std::vector<int64_t> shifts_;
  std::vector<float> cos_, sin_;  // [shifts, D]
};

// Attention of the G query heads q [G, D] of one KV head over `segs` of its stores k, v
// ([cap, D] rows of fp32, fp16 or bf16, widened to fp32), as a Partial; the logits soft-capped
// by `softcap` where it is > 0; a segment with a shift read by q rotated back by it (`rot`).
// p: scratch of at least G * (tokens in segs). The logits and the weighted values run several
// keys and heads at a time where attend_rows.h can.
template <typename T>
Partial attend_segments(const float* q, int64_t g, int64_t d, const T* k, const T* v,
                        const Segment* segs, int64_t n_segs, float scale, float softcap, const Rotations& rot,
                        float* p) {
  std::vector<float> row(static_cast<size_t>(d));
  int64_t n = 0;
  for (int64_t i = 0; i < n_segs; ++i) n += segs[i].len;
  std::vector<float> qm(static_cast<size_t>(g * d));
  int64_t at = 0;
  for (int64_t i = 0; i < n_segs; ++i) {
    const Segment& seg = segs[i];
    const float* qs = q;
    if (seg.shift != 0) {
      rot.rotate_back(q, g, seg.shift, qm.data());
      qs = qm.data();
    }
    if (attend_rows::fast_rows(d))
      attend_rows::logits(qs, g, d, k + seg.start * d, seg.len, scale, p + at, n);
    else
      for (int64_t t = 0; t < seg.len; ++t) {
        const float* kr = kv_rows::widen(k + (seg.start + t) * d, row.data(), d);
        for (int64_t j = 0; j < g; ++j) p[j * n + at + t] = dot(qs + j * d, kr, d) * scale;
      }
    at += seg.len;
  }
  if (softcap > 0.f)  // Gemma 2: each logit x -> cap * tanh(x / cap)
    for (int64_t i = 0; i < g * n; ++i) p[i] = std::tanh(p[i] / softcap) * softcap;
  Partial part{std::vector<float>(static_cast<size_t>(g)), std::vector<float>(static_cast<size_t>(g)),
               std::vector<float>(static_cast<size_t>(g * d), 0.f), std::vector<int64_t>(static_cast<size_t>(g))};
  for (int64_t j = 0; j < g; ++j) {
    float* pj = p + j * n;
    const int64_t top = std::max_element(pj, pj + n) - pj;
    const float m = pj[top];
    int64_t seg = 0, before = 0;  // the segment holding logit `top`, and its first logit's index
    while (before + segs[seg].len <= top) before += segs[seg++].len;
    part.peak[j] = segs[seg].start + (top - before);
    float l = 0.f;
#pragma omp simd reduction(+ : l)
    for (int64_t t = 0; t < n; ++t) {
      pj[t] = exp_nonpositive(pj[t] - m);
      l += pj[t];
    }
    part.m[j] = m;
    part.l[j] = l;
  }
  at = 0;
  for (int64_t i = 0; i < n_segs; ++i) {
    if (attend_rows::fast_rows(d)) {
      attend_rows::add_values(p + at, n, g, d, v + segs[i].start * d, segs[i].len, part.o.data());
      at += segs[i].len;
      continue;
    }
    for (int64_t t = 0; t < segs[i].len; ++t) {
      const float* vr = kv_rows::widen(v + (segs[i].start + t) * d, row.data(), d);
      for (int64_t j = 0; j < g; ++j) {
        const float w = p[j * n + at + t];
        float* o = part.o.data() + j * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) o[c] += w * vr[c];
      }
    }
    at += segs[i].len;
  }
  return part;
}

// Attention of one token's query heads q [Hq, D] over each KV head's segments of the stores
// [Hkv, cap, D], out [Hq, D]; peaks [Hq]: each head's token with the largest logit (the first
// in segment order) where its attention weight is at least `peak_weight`, else -1. The work is
// cut into pieces of about `piece` tokens (whole segments) spread over the threads, then merged
// per KV head (flash-decoding).
template <typename T>
void attend(const float* q, const T* k, const T* v, int64_t cap, const std::vector<std::vector<Segment>>& segs,
            int64_t n_heads, int64_t d, float scale, float softcap, const double* inv_freq, float* out,
            int64_t* peaks, float peak_weight) {
  const int64_t n_kv_heads = static_cast<int64_t>(segs.size());
  const int64_t g = n_heads / n_kv_heads;
  int64_t total = 0;
  for (const auto& head : segs)
    for (const Segment& seg : head) total += seg.len;
  const int64_t piece = std::max<int64_t>(64, total / (4 * at::get_num_threads()) + 1);
  struct Item {
    int64_t head, first, count, tokens;
  };
  std::vector<Item> items;
  for (int64_t h = 0; h < n_kv_heads; ++h) {
    const auto& head = segs[h];
    for (size_t i = 0; i < head.size();) {
      Item it{h, static_cast<int64_t>(i), 0, 0};
      while (i < head.size() && (it.count == 0 || it.tokens + head[i].len <= piece)) {
        it.tokens += head[i].len;
        ++it.count;
        ++i;
      }
      items.push_back(it);
    }
  }
  const Rotations rot(segs, d, inv_freq);
  std::vector<Partial> parts(items.size());
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t first, int64_t last) {
    std::vector<float> p;
    for (int64_t i = first; i < last; ++i) {
      const Item& it = items[i];
      p.resize(static_cast<size_t>(g * it.tokens));
      parts[i] = attend_segments(q + it.head * g * d, g, d, k + it.head * cap * d, v + it.head * cap * d,
                                 segs[it.head].data() + it.first, it.count, scale, softcap, rot, p.data());
    }
  });
  for (int64_t h = 0; h < n_kv_heads; ++h)
    for (int64_t j = 0; j < g; ++j) {
      float m = -std::numeric_limits<float>::infinity();
      bool seen = false;
      for (size_t i = 0; i < items.size(); ++i)
        if (items[i].head == h && (!seen || parts[i].m[j] > m)) {
          m = parts[i].m[j];
          peaks[h * g + j] = parts[i].peak[j];
          seen = true;
        }
      float l = 0.f;
      float* o = out + (h * g + j) * d;
      std::fill(o, o + d, 0.f);
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].head != h) continue;
        const float w = std::exp(parts[i].m[j] - m);
        l += w * parts[i].l[j];
        const float* po = parts[i].o.data() + j * d;
        for (int64_t c = 0; c < d; ++c) o[c] += w * po[c];
      }
      for (int64_t c = 0; c < d; ++c) o[c] /= l;
      if (l * peak_weight > 1.f) peaks[h * g + j] = -1;  // the peak's weight, e^0 / l, is under it
    }
}

// MSA selection of one KV head for the token at `pos`, from the content-frame query heads
// q0 [G, D] (before RoPE) and the layer's content summaries of that head [n_blocks, 2, D]
// (min, max): the sink, the top-k blocks between the sink and the local window by the Quest
// bound summed over the G heads (ties: the lower block), and the local window.
Selection select_head(const float* q0, int64_t g, int64_t d, const float* summaries, int64_t pos, const Settings& s) {
  const int64_t last = pos / s.block_size;
  const int64_t local_start = std::max<int64_t>(0, last - s.local_blocks + 1);
  const int64_t sink_end = std::min(s.sink_blocks, local_start);
  const int64_t n_candidates = local_start - sink_end;
  Selection sel;
  if (n_candidates <= s.topk) {
    sel.blocks.resize(static_cast<size_t>(last + 1));
    std::iota(sel.blocks.begin(), sel.blocks.end(), 0);
    sel.n_far = local_start;
    return sel;
  }
  std::vector<float> neg(static_cast<size_t>(d), 0.f), pos_part(static_cast<size_t>(d), 0.f);
  for (int64_t j = 0; j < g; ++j)
    for (int64_t i = 0; i < d; ++i) {
      const float x = q0[j * d + i];
      (x > 0.f ? pos_part : neg)[i] += x;
    }
  std::vector<float> scores(static_cast<size_t>(n_candidates));
  for (int64_t c = 0; c < n_candidates; ++c) {
    const float* mm = summaries + (sink_end + c) * 2 * d;
    scores[c] = dot(neg.data(), mm, d) + dot(pos_part.data(), mm + d, d);
  }
  std::vector<int64_t> order(static_cast<size_t>(n_candidates));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + s.topk, order.end(), [&](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  for (int64_t r = 0; r < s.topk; ++r) sel.ranked.push_back(order[r] + sink_end);
  for (int64_t b = 0; b < sink_end; ++b) sel.blocks.push_back(b);
  std::vector<int64_t> top(sel.ranked);
  std::sort(top.begin(), top.end());
  sel.blocks.insert(sel.blocks.end(), top.begin(), top.end());
  for (int64_t b = local_start; b <= last; ++b) sel.blocks.push_back(b);
  sel.n_far = sink_end + s.topk;
  return sel;
}

// One selection for every KV head, as wide as one head's: the heads' top-k taken in turn (every
// head's best, then every head's second best, ...), first occurrences, `topk` of them.
Selection share_by_heads(const std::vector<Selection>& heads, const Settings& s) {
  const Selection& first = heads[0];
  if (first.ranked.empty()) return first;
  std::vector<int64_t> taken;
  for (size_t r = 0; r < first.ranked.size() && static_cast<int64_t>(taken.size()) < s.topk; ++r)
    for (const Selection& h : heads) {
      const int64_t b = h.ranked[r];
      if (std::find(taken.begin(), taken.end(), b) == taken.end() && static_cast<int64_t>(taken.size()) < s.topk)
        taken.push_back(b);
    }
  std::sort(taken.begin(), taken.end());
  Selection shared = first;
  const int64_t sink_end = first.n_far - s.topk;
  std::copy(taken.begin(), taken.end(), shared.blocks.begin() + sink_end);
  shared.ranked.clear();
  return shared;
}

// The selection with the answer's blocks (ascending: what the question read, and the blocks
// followed on to) that lie before the token's local window and that it did not choose added to
// its far blocks, in order (msa_decode.py).
Selection with_answer_blocks(const Selection& sel, const std::vector<int64_t>& answer, int64_t pos,
                             const Settings& s) {
  const int64_t window_first = pos / s.block_size - s.local_blocks + 1;
  std::vector<int64_t> far(sel.blocks.begin(), sel.blocks.begin() + sel.n_far);
  const size_t chosen = far.size();
  for (int64_t b : answer)
    if (b < window_first && !std::binary_search(far.begin(), far.begin() + chosen, b)) far.push_back(b);
  if (far.size() == chosen) return sel;
  std::sort(far.begin(), far.end());
  Selection out;
  out.n_far = static_cast<int64_t>(far.size());
  out.blocks = far;
  out.blocks.insert(out.blocks.end(), sel.blocks.begin() + sel.n_far, sel.blocks.end());
  return out;
}

// The segments one token reads in MSA: each selected block up to the token. Far blocks (the
// first n_far) are read at a bounded distance when pos >= bounded_from: far slot j (block b)
// moves forward by (window_first - b) - (n_far - j) blocks, which RoPE lets us apply to the
// query instead of the keys (q . R(s) k = R(-s) q . k).
std::vector<Segment> selected_segments(const Selection& sel, int64_t pos, const Settings& s) {
  const int64_t bs = s.block_size;
  const int64_t window_first = pos / bs - s.local_blocks + 1;
  const bool moved = pos >= s.bounded_from && sel.n_far > 0;
  std::vector<Segment> segs;
  for (size_t j = 0; j < sel.blocks.size(); ++j) {
    const int64_t b = sel.blocks[j];
    const int64_t slot = static_cast<int64_t>(j);
    const int64_t shift = slot < sel.n_far && moved ? (window_first - b) - (sel.n_far - slot) : 0;
    segs.push_back({b * bs, std::min((b + 1) * bs, pos + 1) - b * bs, shift * bs});
  }
  return segs;
}

// The blocks after the far blocks on whose last token a query head's attention peaks (peaks
// [Hq]: rows of the stores, -1: none; sel: each KV head's selection), ascending
// (msa_decode.blocks_after_peaks).
std::vector<int64_t> blocks_after_peaks(const std::vector<int64_t>& peaks, const std::vector<Selection>& sel,
                                        int64_t g, int64_t block_size) {
  std::vector<int64_t> out;
  for (size_t head = 0; head < peaks.size(); ++head) {
    const Selection& mine = sel[head / static_cast<size_t>(g)];
    const int64_t b = peaks[head] / block_size;
    const auto far_end = mine.blocks.begin() + mine.n_far;
    const bool last_token = peaks[head] >= 0 && peaks[head] % block_size == block_size - 1;
    if (last_token && std::find(mine.blocks.begin(), far_end, b) != far_end) out.push_back(b + 1);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The far blocks past the sink on one of whose tokens a query head's attention peaks (peaks as
// blocks_after_peaks), ascending: what the step copies from (msa_decode.blocks_copied_from).
std::vector<int64_t> blocks_copied_from(const std::vector<int64_t>& peaks, const std::vector<Selection>& sel,
                                        int64_t g, int64_t block_size, int64_t sink_blocks) {
  std::vector<int64_t> out;
  for (size_t head = 0; head < peaks.size(); ++head) {
    if (peaks[head] < 0) continue;
    const Selection& mine = sel[head / static_cast<size_t>(g)];
    const int64_t b = peaks[head] / block_size;
    const auto far_end = mine.blocks.begin() + mine.n_far;
    if (b >= sink_blocks && std::find(mine.blocks.begin(), far_end, b) != far_end) out.push_back(b);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The new token's rows x [Hkv, D] written at `pos` of a layer's store [Hkv, cap, D], in the
// store's type.
template <typename T>
void write_rows(const float* x, const at::Tensor& store, int64_t heads, int64_t d, int64_t pos) {
  const int64_t cap = store.size(1);
  T* base = store.data_ptr<T>();
  for (int64_t h = 0; h < heads; ++h) kv_rows::narrow(x + h * d, base + (h * cap + pos) * d, d);
}

void write_token(const float* x, const at::Tensor& store, int64_t heads, int64_t d, int64_t pos) {
  switch (store.scalar_type()) {
    case at::kHalf: return write_rows<at::Half>(x, store, heads, d, pos);
    case at::kBFloat16: return write_rows<at::BFloat16>(x, store, heads, d, pos);
    default: return write_rows<float>(x, store, heads, d, pos);
  }
}

// `attend` over a layer's stores k, v [Hkv, cap, D] of fp32, fp16 or bf16.
void attend_stores(const float* q, const at::Tensor& k, const at::Tensor& v,
                   const std::vector<std::vector<Segment>>& segs, int64_t n_heads, int64_t d, float scale,
                   float softcap, const double* inv_freq, float* out, int64_t* peaks, float peak_weight) {
  const int64_t cap = k.size(1);
  switch (k.scalar_type()) {
    case at::kHalf:
      return attend(q, k.data_ptr<at::Half>(), v.data_ptr<at::Half>(), cap, segs, n_heads, d, scale, softcap,
                    inv_freq, out, peaks, peak_weight);
    case at::kBFloat16:
      return attend(q, k.data_ptr<at::BFloat16>(), v.data_ptr<at::BFloat16>(), cap, segs, n_heads, d, scale,
                    softcap, inv_freq, out, peaks, peak_weight);
    default:
      return attend(q, k.data_ptr<float>(), v.data_ptr<float>(), cap, segs, n_heads, d, scale, softcap, inv_freq,
                    out, peaks, peak_weight);
  }
}

// The segments of a dense read of positions first..end-1: pieces of one block size each, so
// that the threads can share them.
std::vector<Segment> dense_segments(int64_t first, int64_t end, int64_t piece) {
  std::vector<Segment> segs;
  for (int64_t t = first; t < end; t += piece) segs.push_back({t, std::min(piece, end - t), 0});
  return segs;
}

// A linear spec (kind, a, b, group[, bias]) of `in` inputs and `out` outputs; an empty bias is
// none.
Linear make_linear(const py::tuple& spec, int64_t in, int64_t out) {
  Linear l;
  l.kind = spec[0].cast<int64_t>();
  l.a = spec[1].cast<at::Tensor>();
  l.b = spec[2].cast<at::Tensor>();
  l.group = spec[3].cast<int64_t>();
  l.in = in;
  l.out = out;
  if (l.kind == GGML) {
    TORCH_CHECK(ggml_blocks::supported(l.group) && in % ggml_blocks::block_values(l.group) == 0 &&
                    l.a.scalar_type() == at::kByte && l.a.is_contiguous() &&
                    l.a.size(1) == ggml_blocks::bytes_per_row(l.group, in) &&
                    (l.b.numel() == 0 ? l.a.size(0) == out : l.b.numel() == out && l.b.scalar_type() == at::kLong),
                "GGUF blocks must be contiguous uint8 [rows, bytes of a row of `in`], row ids int64 [out]");
  }
  if (spec.size() > 4) {
    at::Tensor bias = spec[4].cast<at::Tensor>();
    if (bias.numel() > 0) {
      TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.numel() == out, "a bias must be fp32 [out]");
      l.bias = bias.contiguous();
    }
  }
  return l;
}

// The layer's `fused` linear, or its parts `names` of `sizes` outputs each when it has them.
LinearGroup make_group(const py::dict& spec, const char* fused, const std::vector<const char*>& names,
                       const std::vector<int64_t>& sizes, int64_t in) {
  LinearGroup group;
  if (spec.contains(fused)) {
    const int64_t out = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    group.parts.push_back(make_linear(spec[fused].cast<py::tuple>(), in, out));
    return group;
  }
  for (size_t i = 0; i < names.size(); ++i)
    group.parts.push_back(make_linear(spec[names[i]].cast<py::tuple>(), in, sizes[i]));
  return group;
}

// The selected blocks that `absent` [L, n_marked] marks in `layer`, in the order the heads
// select them (each once).
std::vector<int64_t> absent_blocks(const std::vector<Selection>& sel, const at::Tensor& absent, int64_t layer) {
  std::vector<int64_t> missing;
  const int64_t n_marked = absent.size(1);
  const bool* gone = absent.data_ptr<bool>() + layer * n_marked;
  for (const Selection& head : sel)
    for (int64_t b : head.blocks)
      if (b < n_marked && gone[b] && std::find(missing.begin(), missing.end(), b) == missing.end())
        missing.push_back(b);
  return missing;
}

// One step's inputs as its layers read them, checked once (DecoderStack::inputs).
struct StepInputs {
  const Cache& cache;
  const Settings& s;
  const Index& index;
  const Answer& answer;
  int64_t pos;
  const float *cos, *sin;  // the angles of pos, [angle_rows, D]
  int64_t angle_rows;
  float softcap;      // <= 0: none
  float peak_weight;  // above 1: no peak reaches it
  bool int8;          // int8 K/V: the token's rows rounded to their grid, scales kept
  bool sparse;        // MSA in every layer without a window (pos >= sparse_from)
  bool by_index;      // MSA's selection by the stored index, not the summaries
};

// A step's working memory, sized once for its layers: h [hidden] a norm's output, qkv
// [(Hq + 2 Hkv) D] the token's q | k | v, q0 [Hq, D] q before RoPE, attn [Hq, D] the attention's
// output, gu [2 I] gate | up, delta [hidden] a block's output before its residual add, peaks [Hq].
struct Scratch {
  Scratch(int64_t hidden, int64_t n_heads, int64_t n_kv_heads, int64_t d, int64_t inter)
      : h(hidden), qkv((n_heads + 2 * n_kv_heads) * d), q0(n_heads * d), attn(n_heads * d), gu(2 * inter),
        delta(hidden), peaks(n_heads) {}
  std::vector<float> h, qkv, q0, attn, gu, delta;
  std::vector<int64_t> peaks;
};

class DecoderStack {
 public:
  DecoderStack(const std::vector<py::dict>& layers, int64_t hidden, int64_t intermediate, int64_t n_heads,
               int64_t n_kv_heads, int64_t head_dim, double eps, at::Tensor inv_freq)
      : hidden_(hidden), inter_(intermediate), n_heads_(n_heads), n_kv_heads_(n_kv_heads), d_(head_dim),
        eps_(static_cast<float>(eps)), inv_freq_(inv_freq.to(at::kDouble).contiguous()) {
    TORCH_CHECK(inv_freq_.numel() == head_dim / 2, "inv_freq must be [head_dim / 2]");
    const int64_t q = n_heads * head_dim, kv = n_kv_heads * head_dim;
    for (const auto& spec : layers) {
      Layer l;
      l.norm_in = spec["norm_in"].cast<at::Tensor>().contiguous();
      l.norm_post = spec["norm_post"].cast<at::Tensor>().contiguous();
      if (spec.contains("q_norm")) {
        l.q_norm = spec["q_norm"].cast<at::Tensor>().contiguous();
        l.k_norm = spec["k_norm"].cast<at::Tensor>().contiguous();
        TORCH_CHECK(l.q_norm.numel() == head_dim && l.k_norm.numel() == head_dim, "q/k norms must be [D]");
      }
      if (spec.contains("attn_out_norm")) {
        l.attn_out_norm = spec["attn_out_norm"].cast<at::Tensor>().contiguous();
        l.mlp_out_norm = spec["mlp_out_norm"].cast<at::Tensor>().contiguous();
        TORCH_CHECK(l.attn_out_norm.numel() == hidden && l.mlp_out_norm.numel() == hidden,
                    "output norms must be [hidden]");
      }
      for (const at::Tensor* t : {&l.norm_in, &l.norm_post, &l.q_norm, &l.k_norm, &l.attn_out_norm, &l.mlp_out_norm})
        TORCH_CHECK(!t->defined() || t->scalar_type() == at::kFloat, "norm weights must be fp32");
      if (spec.contains("q_scale")) l.q_scale = static_cast<float>(spec["q_scale"].cast<double>());
      if (spec.contains("act")) l.act = spec["act"].cast<int64_t>();
      if (spec.contains("torch_norms")) l.torch_norms = spec["torch_norms"].cast<bool>();
      TORCH_CHECK(l.act == SILU || l.act == GELU_TANH, "act must be SILU (0) or GELU_TANH (1)");
      l.qkv = make_group(spec, "qkv", {"q", "k", "v"}, {q, kv, kv}, hidden);
      l.o = make_linear(spec["o"].cast<py::tuple>(), n_heads * head_dim, hidden);
      l.gate_up = make_group(spec, "gate_up", {"gate", "up"}, {intermediate, intermediate}, hidden);
      l.down = make_linear(spec["down"].cast<py::tuple>(), intermediate, hidden);
      layers_.push_back(std::move(l));
    }
  }

  // See DecoderStep.step in decoder_step.py. x [hidden] fp32, updated in place; cos, sin: [D] or
  // [2, D], the angles of `pos` (row 0: the global layers', row 1: the windowed layers'). Runs the
  // layers from `first_layer` on; the layers after the selection layer read `shared` where it
  // selected in an earlier call. A layer that selects blocks `absent` marks stops the step before
  // reading them, x as that layer found it: load them, then call again from `stopped_at` with the
  // result's `shared`.
  StepResult step(at::Tensor x, const Cache& cache, int64_t pos, at::Tensor cos, at::Tensor sin,
                  const Settings& settings, const Index& index, const Answer& answer, int64_t first_layer,
                  const std::optional<Selection>& shared) const {
    const StepInputs in = inputs(x, cache, pos, cos, sin, settings, index, answer);
    Scratch w(hidden_, n_heads_, n_kv_heads_, d_, inter_);
    StepResult result;
    result.shared = shared;
    result.followed.resize(layers_.size());
    result.copied.resize(layers_.size());
    float* xs = x.data_ptr<float>();
    for (size_t li = static_cast<size_t>(first_layer); li < layers_.size(); ++li) {
      std::vector<int64_t> missing = attention(li, in, xs, w, result);
      if (!missing.empty()) {
        result.stopped_at = static_cast<int64_t>(li);
        result.missing = std::move(missing);
        return result;
      }
      mlp(layers_[li], xs, w);
    }
    return result;
  }

 private:
  // The step's inputs checked (each layer's K/V stores as it runs), with what its layers share.
  StepInputs inputs(const at::Tensor& x, const Cache& cache, int64_t pos, const at::Tensor& cos,
                    const at::Tensor& sin, const Settings& s, const Index& index, const Answer& answer) const {
    const size_t n_layers = layers_.size();
    TORCH_CHECK(x.is_contiguous() && x.scalar_type() == at::kFloat && x.numel() == hidden_, "x must be fp32 [hidden]");
    TORCH_CHECK(cache.keys.size() == n_layers && cache.values.size() == n_layers, "one K and V store per layer");
    const bool int8 = !cache.key_scales.empty();
    TORCH_CHECK(!int8 || (cache.key_scales.size() == n_layers && cache.value_scales.size() == n_layers),
                "int8 K/V: one K and V scale store per layer");
    TORCH_CHECK(answer.blocks.empty() || answer.blocks.size() == n_layers, "answer blocks: one list per layer, or none");
    TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == at::kFloat &&
                    sin.sizes() == cos.sizes() && sin.scalar_type() == at::kFloat && cos.size(-1) == d_ &&
                    (cos.dim() == 1 || (cos.dim() == 2 && (cos.size(0) == 1 || cos.size(0) == 2))),
                "cos, sin must be contiguous fp32 [D] or [1 or 2, D]");
    const bool sparse = pos >= s.sparse_from;
    const bool by_index = !index.codes.empty();
    TORCH_CHECK(!by_index || (index.codes.size() == n_layers && index.scales.size() == n_layers &&
                              index.means.size() == n_layers),
                "index: codes, scales, means per layer");
    if (sparse && !by_index) {
      const at::Tensor& sums = cache.summaries;
      TORCH_CHECK(sums.is_contiguous() && sums.scalar_type() == at::kFloat && sums.dim() == 5 &&
                      sums.size(0) == static_cast<int64_t>(n_layers) && sums.size(1) == n_kv_heads_ &&
                      sums.size(2) >= pos / s.block_size,
                  "summaries must be fp32 [L, Hkv, >= full blocks, 2, D]");
      TORCH_CHECK(cache.absent.scalar_type() == at::kBool && cache.absent.dim() == 2 && cache.absent.is_contiguous() &&
                      cache.absent.size(0) == static_cast<int64_t>(n_layers),
                  "absent must be bool [L, blocks]");
    }
    return {cache,
            s,
            index,
            answer,
            pos,
            cos.data_ptr<float>(),
            sin.data_ptr<float>(),
            cos.dim() == 1 ? 1 : cos.size(0),
            static_cast<float>(s.softcap.value_or(0.0)),
            static_cast<float>(answer.peak_weight.value_or(2.0)),
            int8,
            sparse,
            by_index};
  }

  // Layer li's attention of the token, x += its output (through the layer's output norm where it
  // has one): the token's q, k, v and K/V (token_qkv), then a dense read (before sparse_from; a
  // windowed layer's (pos - window, pos] always, never MSA) or MSA's selected blocks. Returns the
  // selected blocks that `absent` marks, unread and x unchanged; empty: the layer ran.
  std::vector<int64_t> attention(size_t li, const StepInputs& in, float* x, Scratch& w, StepResult& result) const {
    const Layer& l = layers_[li];
    const int64_t window = in.s.window(li);
    const float* q = token_qkv(li, window, in, x, w);
    const at::Tensor& ks = in.cache.keys[li];
    const at::Tensor& vs = in.cache.values[li];
    const float scale = 1.f / std::sqrt(static_cast<float>(d_));
    const double* inv_freq = inv_freq_.data_ptr<double>();
    if (!in.sparse || window > 0 || static_cast<int64_t>(li) < in.s.dense_layers) {
      const int64_t from = window > 0 ? std::max<int64_t>(0, in.pos - window + 1) : 0;
      const std::vector<std::vector<Segment>> segs(static_cast<size_t>(n_kv_heads_),
                                                   dense_segments(from, in.pos + 1, in.s.block_size));
      attend_stores(q, ks, vs, segs, n_heads_, d_, scale, in.softcap, inv_freq, w.attn.data(), w.peaks.data(),
                    in.peak_weight);
    } else {
      const std::vector<Selection> sel = select(li, q, in, w, result.shared);
      std::vector<int64_t> missing = absent_blocks(sel, in.cache.absent, static_cast<int64_t>(li));
      if (!missing.empty()) return missing;
      std::vector<std::vector<Segment>> segs;
      for (const Selection& head : sel) segs.push_back(selected_segments(head, in.pos, in.s));
      attend_stores(q, ks, vs, segs, n_heads_, d_, scale, in.softcap, inv_freq, w.attn.data(), w.peaks.data(),
                    in.peak_weight);
      const int64_t g = n_heads_ / n_kv_heads_;
      result.followed[li] = blocks_after_peaks(w.peaks, sel, g, in.s.block_size);
      result.copied[li] = blocks_copied_from(w.peaks, sel, g, in.s.block_size, in.s.sink_blocks);
    }
    l.o.apply(w.attn.data(), w.delta.data());
    if (l.attn_out_norm.defined()) norm(l, w.delta.data(), l.attn_out_norm, w.delta.data(), 1, hidden_);
    for (int64_t i = 0; i < hidden_; ++i) x[i] += w.delta[i];
    return {};
  }

  // The token's q, k, v in layer li (input norm, products, per-head q/k norms, q scale), q before
  // RoPE kept in w.q0 (the content frame MSA's summaries score), then q and k rotated by the layer
  // kind's angles and the token's K/V written at pos (int8 K/V: rounded to their grid, scales
  // kept). Returns q [Hq, D] (in w.qkv).
  const float* token_qkv(size_t li, int64_t window, const StepInputs& in, const float* x, Scratch& w) const {
    const Layer& l = layers_[li];
    const at::Tensor& ks = in.cache.keys[li];
    const at::Tensor& vs = in.cache.values[li];
    const int64_t cap = ks.size(1), pos = in.pos;
    const at::ScalarType kv_type = ks.scalar_type();
    TORCH_CHECK(ks.is_contiguous() && vs.is_contiguous() && vs.scalar_type() == kv_type &&
                    (kv_type == at::kFloat || kv_type == at::kHalf || kv_type == at::kBFloat16) &&
                    (!in.int8 || kv_type == at::kFloat) && pos < cap && vs.size(1) == cap,
                "K/V stores must be contiguous fp32, fp16 or bf16 [Hkv, cap, D] with room for the token "
                "(int8 K/V: fp32)");
    if (in.int8) {
      for (const at::Tensor* t : {&in.cache.key_scales[li], &in.cache.value_scales[li]})
        TORCH_CHECK(t->is_contiguous() && t->scalar_type() == at::kFloat && t->dim() == 2 &&
                        t->size(0) == n_kv_heads_ && t->size(1) == cap,
                    "int8 K/V scales must be contiguous fp32 [Hkv, cap]");
    }
    norm(l, x, l.norm_in, w.h.data(), 1, hidden_);
    l.qkv.apply(w.h.data(), w.qkv.data());
    float* q = w.qkv.data();
    float* k = q + n_heads_ * d_;
    float* v = k + n_kv_heads_ * d_;
    if (l.q_norm.defined()) {  // each head of q and k RMS-normalized over D, before RoPE
      norm(l, q, l.q_norm, q, n_heads_, d_);
      norm(l, k, l.k_norm, k, n_kv_heads_, d_);
    }
    if (l.q_scale != 1.f)
      for (int64_t i = 0; i < n_heads_ * d_; ++i) q[i] *= l.q_scale;
    std::copy(q, q + n_heads_ * d_, w.q0.begin());
    // a windowed layer's angles: the second row where there is one (Gemma 3's local base)
    const int64_t angles = window > 0 && in.angle_rows > 1 ? d_ : 0;
    rope(q, n_heads_ + n_kv_heads_, d_, in.cos + angles, in.sin + angles);  // q and k lie side by side
    if (in.int8) {
      float* k_scale = in.cache.key_scales[li].data_ptr<float>();
      float* v_scale = in.cache.value_scales[li].data_ptr<float>();
      for (int64_t kvh = 0; kvh < n_kv_heads_; ++kvh) {
        k_scale[kvh * cap + pos] = kv_rows::round_to_int8_grid(k + kvh * d_, d_);
        v_scale[kvh * cap + pos] = kv_rows::round_to_int8_grid(v + kvh * d_, d_);
      }
    }
    write_token(k, ks, n_kv_heads_, d_, pos);  // attention reads the token back as stored
    write_token(v, vs, n_kv_heads_, d_, pos);
    return q;
  }

  // The blocks each KV head reads in MSA layer li: by the stored index; in a layer after the
  // selection layer, that layer's (`shared`); else by the summaries, one set for every KV head
  // (the heads' choices taken in turn) with the answer's blocks, which becomes `shared` in the
  // selection layer. q [Hq, D]: the token's query heads after RoPE, w.q0 before.
  std::vector<Selection> select(size_t li, const float* q, const StepInputs& in, const Scratch& w,
                                std::optional<Selection>& shared) const {
    const Settings& s = in.s;
    const auto heads = static_cast<size_t>(n_kv_heads_);
    const int64_t layer = static_cast<int64_t>(li);
    if (in.by_index) return index_selection(q, li, in);
    if (s.selection_layer && layer > *s.selection_layer && shared) return std::vector<Selection>(heads, *shared);
    const int64_t n_blocks = in.cache.summaries.size(2);
    const float* sums = in.cache.summaries.data_ptr<float>() + layer * n_kv_heads_ * n_blocks * 2 * d_;
    const int64_t g = n_heads_ / n_kv_heads_;
    std::vector<Selection> sel(heads);
    at::parallel_for(0, n_kv_heads_, 1, [&](int64_t first, int64_t last) {
      for (int64_t kvh = first; kvh < last; ++kvh)
        sel[kvh] = select_head(w.q0.data() + kvh * g * d_, g, d_, sums + kvh * n_blocks * 2 * d_, in.pos, s);
    });
    Selection joined = share_by_heads(sel, s);
    if (!in.answer.blocks.empty()) joined = with_answer_blocks(joined, in.answer.blocks[li], in.pos, s);
    if (s.selection_layer == layer) shared = joined;
    return std::vector<Selection>(heads, joined);
  }

  // x += the layer's MLP: Down(act(G) * U) with G | U = GateUp(norm_post(x)), through the layer's
  // output norm where it has one.
  void mlp(const Layer& l, float* x, Scratch& w) const {
    norm(l, x, l.norm_post, w.h.data(), 1, hidden_);
    l.gate_up.apply(w.h.data(), w.gu.data());
    float* gu = w.gu.data();
    if (l.act == GELU_TANH && l.torch_norms) {  // PyTorch's GELU kernel, as the per-op path
      at::Tensor gate = at::from_blob(gu, {1, inter_}, at::kFloat);
      at::Tensor up = at::from_blob(gu + inter_, {1, inter_}, at::kFloat);
      at::mul_out(gate, at::gelu(gate, "tanh"), up);
    } else if (l.act == GELU_TANH) {
      for (int64_t i = 0; i < inter_; ++i) gu[i] = gelu_tanh(gu[i]) * gu[inter_ + i];
    } else {
      for (int64_t i = 0; i < inter_; ++i) {
        const float gate = gu[i];
        gu[i] = gate / (1.f + std::exp(-gate)) * gu[inter_ + i];
      }
    }
    l.down.apply(gu, w.delta.data());
    if (l.mlp_out_norm.defined()) norm(l, w.delta.data(), l.mlp_out_norm, w.delta.data(), 1, hidden_);
    for (int64_t i = 0; i < hidden_; ++i) x[i] += w.delta[i];
  }

  // `rows` rows of n through a layer's RMSNorm of weight w [n] (in place where y == x)
  void norm(const Layer& l, const float* x, const at::Tensor& w, float* y, int64_t rows, int64_t n) const {
    if (l.torch_norms) return rms_norm_as_torch(x, w.data_ptr<float>(), y, rows, n, eps_);
    for (int64_t row = 0; row < rows; ++row) rms_norm(x + row * n, w.data_ptr<float>(), y + row * n, n, eps_);
  }

  // The blocks each KV head reads in layer li by the stored index (select_index.h), its query heads
  // q [Hq, D] at their true position.
  std::vector<Selection> index_selection(const float* q, size_t li, const StepInputs& in) const {
    const Settings& s = in.s;
    const at::Tensor& codes = in.index.codes[li];
    const at::Tensor& scales = in.index.scales[li];
    const at::Tensor& means = in.index.means[li];
    const int64_t indexed = codes.numel() ? in.index.tokens : 0;
    TORCH_CHECK(indexed == 0 || (codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 3 &&
                                 codes.size(1) >= indexed && scales.scalar_type() == at::kHalf &&
                                 scales.is_contiguous() && means.scalar_type() == at::kHalf &&
                                 means.is_contiguous() && means.size(1) * s.block_size >= indexed),
                "index: contiguous codes uint8 [Hkv, cap, D/2], scales fp16 [Hkv, cap], means fp16 [Hkv, blocks, D]");
    const block_index::IndexView view{
        indexed ? codes.data_ptr<uint8_t>() : nullptr, indexed ? scales.data_ptr<c10::Half>() : nullptr,
        indexed ? means.data_ptr<c10::Half>() : nullptr, indexed ? codes.size(1) : 0,
        indexed ? means.size(1) : 0, indexed, s.block_size};
    const block_index::Budget budget{s.block_size, s.topk, s.local_blocks, s.sink_blocks,
                                     in.index.top_p.value_or(0.0)};
    const float scale = 1.f / std::sqrt(static_cast<float>(d_));
    const at::Tensor& ks = in.cache.keys[li];
    const int64_t cap = ks.size(1);
    std::vector<block_index::Chosen> chosen;
    switch (ks.scalar_type()) {
      case at::kHalf:
        chosen = block_index::select_by_index(q, n_heads_, n_kv_heads_, d_, scale, view, ks.data_ptr<at::Half>(), cap,
                                              in.pos, budget);
        break;
      case at::kBFloat16:
        chosen = block_index::select_by_index(q, n_heads_, n_kv_heads_, d_, scale, view,
                                              ks.data_ptr<at::BFloat16>(), cap, in.pos, budget);
        break;
      default:
        chosen = block_index::select_by_index(q, n_heads_, n_kv_heads_, d_, scale, view, ks.data_ptr<float>(), cap,
                                              in.pos, budget);
    }
    std::vector<Selection> sel(chosen.size());
    for (size_t kvh = 0; kvh < chosen.size(); ++kvh) {
      sel[kvh].blocks = std::move(chosen[kvh].blocks);
      sel[kvh].n_far = chosen[kvh].n_far;
    }
    return sel;
  }

  std::vector<Layer> layers_;
  int64_t hidden_, inter_, n_heads_, n_kv_heads_, d_;
  float eps_;
  at::Tensor inv_freq_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Settings>(m, "Settings")
      .def(py::init<>())
      .def_readwrite("sparse_from", &Settings::sparse_from)
      .def_readwrite("bounded_from", &Settings::bounded_from)
      .def_readwrite("block_size", &Settings::block_size)
      .def_readwrite("topk", &Settings::topk)
      .def_readwrite("local_blocks", &Settings::local_blocks)
      .def_readwrite("sink_blocks", &Settings::sink_blocks)
      .def_readwrite("selection_layer", &Settings::selection_layer)
      .def_readwrite("windows", &Settings::windows)
      .def_readwrite("softcap", &Settings::softcap)
      .def_readwrite("dense_layers", &Settings::dense_layers);
  py::class_<Cache>(m, "Cache")
      .def(py::init<>())
      .def_readwrite("keys", &Cache::keys)
      .def_readwrite("values", &Cache::values)
      .def_readwrite("key_scales", &Cache::key_scales)
      .def_readwrite("value_scales", &Cache::value_scales)
      .def_readwrite("summaries", &Cache::summaries)
      .def_readwrite("absent", &Cache::absent);
  py::class_<Index>(m, "Index")
      .def(py::init<>())
      .def_readwrite("codes", &Index::codes)
      .def_readwrite("scales", &Index::scales)
      .def_readwrite("means", &Index::means)
      .def_readwrite("tokens", &Index::tokens)
      .def_readwrite("top_p", &Index::top_p);
  py::class_<Answer>(m, "Answer")
      .def(py::init<>())
      .def_readwrite("blocks", &Answer::blocks)
      .def_readwrite("peak_weight", &Answer::peak_weight);
  py::class_<Selection>(m, "Selection")
      .def_readonly("blocks", &Selection::blocks)
      .def_readonly("n_far", &Selection::n_far);
  py::class_<StepResult>(m, "StepResult")
      .def_readonly("stopped_at", &StepResult::stopped_at)
      .def_readonly("missing", &StepResult::missing)
      .def_readonly("shared", &StepResult::shared)
      .def_readonly("followed", &StepResult::followed)
      .def_readonly("copied", &StepResult::copied);
  py::class_<DecoderStack>(m, "DecoderStack")
      .def(py::init<const std::vector<py::dict>&, int64_t, int64_t, int64_t, int64_t, int64_t, double, at::Tensor>())
      .def("step", &DecoderStack::step, py::arg("x"), py::arg("cache"), py::arg("pos"), py::arg("cos"), py::arg("sin"),
           py::arg("settings"), py::arg("index"), py::arg("answer"), py::arg("first_layer"), py::arg("shared"),
           py::call_guard<py::gil_scoped_release>());
}
