// The input of a one-row product quantized to int8 as llama.cpp quantizes a matvec's
// activation, in the format its weight type multiplies (ggml-quants.c):
// - Q5_0 and Q8_0 weights: llama.cpp's block_q8_0, groups of 32: d = max |x| / 127 (kept as
//   fp16, as the block stores it), q = round(x * (127 / max |x|)), ties to even;
// - Q4_K and Q6_K weights: its block_q8_K, blocks of 256: with m the value of largest |x| (the
//   first such), q = min(127, round(x * (-127 / m))), ties to even, d = 1 / (-127 / m) in fp32,
//   and the sum of q over each 16 (the weights' mins and offsets multiply them).
// A block of zeros is d = 0, q = 0. The block products (ggml_blocks_avx2.h, _portable.h) then
// multiply the weights' q by these q in integers, exactly, and scale in fp32.
// msa.kernels.ggml_blocks.quantize_input is the same in PyTorch (the tests' definition).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ggml_block_types.h"

namespace ggml_blocks {

struct InputQ8 {
  std::vector<int8_t> q;       // [k]
  std::vector<float> d;        // [k / 32] (Q8_0 format) or [k / 256] (Q8_K)
  std::vector<int16_t> sums;   // [k / 16]: the sum of each 16 q (Q8_K only)
};

inline float rounded_to_half(float v) { return static_cast<float>(c10::Half(v)); }

// x [k] (k a multiple of 32) in groups of 32, llama.cpp's quantize_row_q8_0 (its AVX2 code).
inline void quantize_q8_0(const float* x, int64_t k, InputQ8& out) {
  out.q.resize(static_cast<size_t>(k));
  out.d.resize(static_cast<size_t>(k / 32));
  for (int64_t g = 0; g < k / 32; ++g) {
    const float* xg = x + g * 32;
#ifdef MSA_AVX512
    const __m512 v[2] = {_mm512_loadu_ps(xg), _mm512_loadu_ps(xg + 16)};
    const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    const __m512 scale = _mm512_set1_ps(top != 0.f ? 127.f / top : 0.f);
    for (int h = 0; h < 2; ++h)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q.data() + g * 32 + 16 * h),
                       _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v[h], scale))));
    out.d[g] = rounded_to_half(top / 127.f);
    continue;
#endif
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xg[i]));
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    for (int i = 0; i < 32; ++i) out.q[g * 32 + i] = static_cast<int8_t>(std::nearbyint(xg[i] * id));
    out.d[g] = rounded_to_half(amax / 127.f);
  }
}

#ifdef MSA_AVX512
// One Q8_K block of 256, 16 values a vector: the loop of quantize_q8_K's values exactly (the
// first value of largest |x|, the same fp32 products, rounded to nearest even by cvtps). False
// for a block of zeros, left to that loop.
inline bool quantize_block_q8_K_512(const float* xb, int8_t* qb, int16_t* sums, float& d) {
  __m512 v[16], top = _mm512_setzero_ps();
  for (int i = 0; i < 16; ++i) {
    v[i] = _mm512_loadu_ps(xb + 16 * i);
    top = _mm512_max_ps(top, _mm512_abs_ps(v[i]));
  }
  const float amax = _mm512_reduce_max_ps(top);
  if (amax == 0.f) return false;
  float m = 0.f;
  for (int i = 0; i < 16; ++i) {
    const __mmask16 at = _mm512_cmp_ps_mask(_mm512_abs_ps(v[i]), _mm512_set1_ps(amax), _CMP_EQ_OQ);
    if (at) {
      m = xb[16 * i + __builtin_ctz(at)];
      break;
    }
  }
  const float iscale = -127.f / m;
  for (int i = 0; i < 16; ++i) {
    const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v[i], _mm512_set1_ps(iscale))),
                                       _mm512_set1_epi32(127));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16 * i), _mm512_cvtepi32_epi8(q));
    sums[i] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
  }
  d = 1.f / iscale;
  return true;
}
#endif

// x [k] (k a multiple of 256) in blocks of 256, llama.cpp's quantize_row_q8_K_ref.
inline void quantize_q8_K(const float* x, int64_t k, InputQ8& out) {
  out.q.resize(static_cast<size_t>(k));
  out.d.resize(static_cast<size_t>(k / 256));
  out.sums.resize(static_cast<size_t>(k / 16));
  for (int64_t b = 0; b < k / 256; ++b) {
    const float* xb = x + b * 256;
    int8_t* qb = out.q.data() + b * 256;
#ifdef MSA_AVX512
    if (quantize_block_q8_K_512(xb, qb, out.sums.data() + b * 16, out.d[b])) continue;
#endif
    float amax = 0.f, m = 0.f;
    for (int i = 0; i < 256; ++i)
      if (std::fabs(xb[i]) > amax) {
        amax = std::fabs(xb[i]);
        m = xb[i];
      }
    const float iscale = amax != 0.f ? -127.f / m : 0.f;
    for (int i = 0; i < 256; ++i)
      qb[i] = static_cast<int8_t>(std::min(127.f, std::nearbyint(xb[i] * iscale)));
    for (int s = 0; s < 16; ++s) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += qb[16 * s + i];
      out.sums[b * 16 + s] = static_cast<int16_t>(sum);
    }
    out.d[b] = amax != 0.f ? 1.f / iscale : 0.f;
  }
}

inline void quantize_input(int64_t type, const float* x, int64_t k, InputQ8& out) {
  if (k_quant(type))
    quantize_q8_K(x, k, out);
  else
    quantize_q8_0(x, k, out);
}

}  // namespace ggml_blocks
