// The exact pass of a question's scan (msa.kernels.peaks) over a chunk of keys, on CPUs with
// AVX-512: for each query the largest fp32 logit of each block of keys, and over the chunk the
// largest logit and the sum of exp(logit - largest), without writing the logits out. Sixteen
// queries sit in the lanes of a vector, so a block's maxima and the sums are taken lane by lane;
// each key's channels are broadcast in turn, four keys at once for four independent sums.
// msa.kernels.exact_peaks' `exact_peaks_reference` is the definition in plain PyTorch this
// kernel is tested against. Included by question_scan.cpp, after torch/extension.h.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#ifdef MSA_AVX512
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include "avx512_exp2.h"
#endif

namespace question_scan {

#ifdef MSA_AVX512

constexpr int64_t kQueryLanes = 16;  // queries a vector holds
constexpr int64_t kKeyStep = 8;      // keys summed side by side at most; blocks: a multiple of it
constexpr int kVectorsAtOnce = 4;    // vectors of queries read with each broadcast key channel
constexpr float kLog2eExact = 1.44269504088896341f;

// The logits of KJ keys (rows of d fp32 at keys) with NV vectors of queries (qt [d][width],
// transposed, from lane 0 of vector 0), into logits [KJ][kVectorsAtOnce][16]: KJ * NV sums side
// by side, enough to hide the latency of each one's fused multiply-adds.
template <int NV, int KJ>
inline void some_keys(const float* keys, int64_t d, const float* qt, int64_t width, float* logits) {
  __m512 acc[KJ][NV];
  for (int j = 0; j < KJ; ++j)
    for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; ++c) {
    __m512 q[NV];
    for (int v = 0; v < NV; ++v) q[v] = _mm512_loadu_ps(qt + c * width + v * kQueryLanes);
    for (int j = 0; j < KJ; ++j) {
      const __m512 k = _mm512_set1_ps(keys[j * d + c]);
      for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_fmadd_ps(k, q[v], acc[j][v]);
    }
  }
  for (int j = 0; j < KJ; ++j)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(logits + (j * kVectorsAtOnce + v) * kQueryLanes, acc[j][v]);
}

// One task: head h's keys of blocks [b0, b1) against NV query vectors starting at vector v0:
// each block's maxima into block_max, the range's largest logit and sum of exp(logit - largest)
// into top, total (16 * NV lanes; e^x taken as 2^(x log2 e)).
template <int NV>
inline void exact_range(const float* keys, int64_t d, int64_t block_size, int64_t b0, int64_t b1, const float* qt,
                        int64_t width, float* block_max, float* top, float* total, float* logits) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 log2e = _mm512_set1_ps(kLog2eExact);
  __m512 m[NV], l[NV];
  for (int v = 0; v < NV; ++v) {
    m[v] = neg_inf;
    l[v] = _mm512_setzero_ps();
  }
  for (int64_t b = b0; b < b1; ++b) {
    const float* block = keys + b * block_size * d;
    __m512 bm[NV];
    for (int v = 0; v < NV; ++v) bm[v] = neg_inf;
    constexpr int KJ = NV == 1 ? kKeyStep : kKeyStep / 2;
    for (int64_t j = 0; j + KJ <= block_size; j += KJ) {
      float* out = logits + j * kVectorsAtOnce * kQueryLanes;
      some_keys<NV, KJ>(block + j * d, d, qt, width, out);
      for (int i = 0; i < KJ; ++i)
        for (int v = 0; v < NV; ++v)
          bm[v] = _mm512_max_ps(bm[v], _mm512_loadu_ps(out + (i * kVectorsAtOnce + v) * kQueryLanes));
    }
    for (int v = 0; v < NV; ++v) {
      _mm512_storeu_ps(block_max + (b - b0) * width + v * kQueryLanes, bm[v]);
      // the running sum of 2^(log2e (logit - m)), rescaled when the block raises the maximum
      const __m512 m_new = _mm512_max_ps(m[v], bm[v]);
      const __m512 scaled_new = _mm512_mul_ps(m_new, log2e);
      __m512 sum = _mm512_mul_ps(l[v], exp2_nonpositive(_mm512_fmsub_ps(m[v], log2e, scaled_new)));
      sum = _mm512_mask_mov_ps(sum, _mm512_cmp_ps_mask(m[v], neg_inf, _CMP_EQ_OQ), _mm512_setzero_ps());
      for (int64_t j = 0; j < block_size; ++j)
        sum = _mm512_add_ps(sum, exp2_nonpositive(_mm512_fmsub_ps(
                                     _mm512_loadu_ps(logits + (j * kVectorsAtOnce + v) * kQueryLanes), log2e, scaled_new)));
      m[v] = m_new;
      l[v] = sum;
    }
  }
  for (int v = 0; v < NV; ++v) {
    _mm512_storeu_ps(top + v * kQueryLanes, m[v]);
    _mm512_storeu_ps(total + v * kQueryLanes, l[v]);
  }
}

#endif  // MSA_AVX512

inline bool built_with_avx512() {
#ifdef MSA_AVX512
  return true;
#else
  return false;
#endif
}

// q fp32 [Hkv, k, D] contiguous; keys fp32 [Hkv, n, D], rows contiguous, n a multiple of
// block_size, itself a multiple of 8. Returns (block_max fp32 [Hkv, k, n / B]: each query's
// largest logit q . key in each block; top fp32 [Hkv, k]: its largest over the keys; total fp32
// [Hkv, k]: the sum over the keys of exp(logit - top)).
inline std::vector<at::Tensor> exact_peaks(at::Tensor q, at::Tensor keys, int64_t block_size) {
  TORCH_CHECK(built_with_avx512(), "built without AVX-512");
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.dim() == 3 && q.is_contiguous(), "q: contiguous fp32 [Hkv, k, D]");
  const int64_t hkv = q.size(0), k = q.size(1), d = q.size(2);
  TORCH_CHECK(keys.scalar_type() == at::kFloat && keys.dim() == 3 && keys.size(0) == hkv && keys.size(2) == d &&
                  keys.stride(2) == 1 && keys.stride(1) == d,
              "keys: fp32 [Hkv, n, D] as q, rows contiguous");
  TORCH_CHECK(block_size >= kKeyStep && block_size % kKeyStep == 0 && keys.size(1) % block_size == 0,
              "block_size: a multiple of 8 that divides the keys");
  const int64_t n_blocks = keys.size(1) / block_size;
  at::Tensor block_max = at::empty({hkv, k, n_blocks}, at::kFloat);
  at::Tensor top = at::empty({hkv, k}, at::kFloat);
  at::Tensor total = at::empty({hkv, k}, at::kFloat);
#ifdef MSA_AVX512
  // queries transposed, each head's padded to whole vectors: qt [Hkv][D][width]
  const int64_t vectors = (k + kQueryLanes - 1) / kQueryLanes, width = vectors * kQueryLanes;
  std::vector<float> qt(hkv * d * width, 0.f);
  const float* qd = q.data_ptr<float>();
  for (int64_t h = 0; h < hkv; ++h)
    for (int64_t i = 0; i < k; ++i)
      for (int64_t c = 0; c < d; ++c) qt[(h * d + c) * width + i] = qd[(h * k + i) * d + c];
  // tasks: (head, group of up to kVectorsAtOnce vectors, range of blocks), each with its own
  // maxima, top and total, merged below
  const int64_t groups = (vectors + kVectorsAtOnce - 1) / kVectorsAtOnce;
  const int64_t ranges = std::min<int64_t>(n_blocks, 16), per_range = (n_blocks + ranges - 1) / ranges;
  std::vector<float> maxima(hkv * n_blocks * width), tops(hkv * ranges * width), totals(hkv * ranges * width);
  const float* kd = keys.data_ptr<float>();
  at::parallel_for(0, hkv * groups * ranges, 1, [&](int64_t first, int64_t last) {
    std::vector<float> logits(block_size * kVectorsAtOnce * kQueryLanes);
    for (int64_t task = first; task < last; ++task) {
      const int64_t h = task / (groups * ranges), g = task / ranges % groups, r = task % ranges;
      const int64_t b0 = r * per_range, b1 = std::min(n_blocks, b0 + per_range);
      if (b0 >= b1) continue;
      const int64_t v0 = g * kVectorsAtOnce, nv = std::min<int64_t>(kVectorsAtOnce, vectors - v0);
      const float* keys_h = kd + h * keys.stride(0);
      const float* qt_g = qt.data() + h * d * width + v0 * kQueryLanes;
      float* bm = maxima.data() + (h * n_blocks + b0) * width + v0 * kQueryLanes;
      float* tp = tops.data() + (h * ranges + r) * width + v0 * kQueryLanes;
      float* tt = totals.data() + (h * ranges + r) * width + v0 * kQueryLanes;
      switch (nv) {
        case 4: exact_range<4>(keys_h, d, block_size, b0, b1, qt_g, width, bm, tp, tt, logits.data()); break;
        case 3: exact_range<3>(keys_h, d, block_size, b0, b1, qt_g, width, bm, tp, tt, logits.data()); break;
        case 2: exact_range<2>(keys_h, d, block_size, b0, b1, qt_g, width, bm, tp, tt, logits.data()); break;
        default: exact_range<1>(keys_h, d, block_size, b0, b1, qt_g, width, bm, tp, tt, logits.data()); break;
      }
    }
  });
  float* out_max = block_max.data_ptr<float>();
  float* out_top = top.data_ptr<float>();
  float* out_total = total.data_ptr<float>();
  for (int64_t h = 0; h < hkv; ++h)
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t b = 0; b < n_blocks; ++b) out_max[(h * k + i) * n_blocks + b] = maxima[(h * n_blocks + b) * width + i];
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t r = 0; r < ranges; ++r)
        if (r * per_range < n_blocks) m = std::max(m, tops[(h * ranges + r) * width + i]);
      float sum = 0.f;
      for (int64_t r = 0; r < ranges; ++r)
        if (r * per_range < n_blocks) {
          const float t = tops[(h * ranges + r) * width + i];
          sum += totals[(h * ranges + r) * width + i] * std::exp(t - m);
        }
      out_top[h * k + i] = m;
      out_total[h * k + i] = sum;
    }
#endif
  return {block_max, top, total};
}

}  // namespace question_scan

#ifdef MSA_AVX512
#pragma GCC pop_options
#endif
