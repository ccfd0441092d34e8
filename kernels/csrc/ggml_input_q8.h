// The input of a one-row product quantized to int8, as llama.cpp quantizes a matvec's
// activation (its Q8_0 blocks, with the scale kept in fp32 rather than fp16): per group of 32
// values, d = max |x| / 127 and q = round(x * (1 / d)), ties to even (0 where the group is all
// zeros). The block products (ggml_blocks_avx2.h, ggml_blocks_portable.h) then multiply int8
// weights by q in integers, exactly, and scale each group's integer sum once.
// msa.kernels.ggml_blocks.quantize_input is the same in PyTorch (the tests' definition).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ggml_block_types.h"

namespace ggml_blocks {

struct InputQ8 {
  std::vector<int8_t> q;     // [k]
  std::vector<float> d;      // [k / 32]: each group's scale
  std::vector<float> dsum;   // [k / 32]: d * the sum of the group's q (Q4_K's mins multiply it)
};

// x [k] (k a multiple of 32) -> its groups of 32 quantized.
inline void quantize_input(const float* x, int64_t k, InputQ8& out) {
  const int64_t n = k / 32;
  out.q.resize(static_cast<size_t>(k));
  out.d.resize(static_cast<size_t>(n));
  out.dsum.resize(static_cast<size_t>(n));
  for (int64_t g = 0; g < n; ++g) {
    const float* xg = x + g * 32;
    int8_t* qg = out.q.data() + g * 32;
    int sum = 0;
#ifdef __AVX2__
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xg + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.f;
    const __m256 id = _mm256_set1_ps(d != 0.f ? 1.f / d : 0.f);
    __m256i q32[4];
    for (int i = 0; i < 4; ++i)
      q32[i] = _mm256_cvtps_epi32(
          _mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // int32 -> int8 in order: packs interleave 128-bit lanes, the permute puts them back
    const __m256i q16 = _mm256_packs_epi32(q32[0], q32[1]), q16b = _mm256_packs_epi32(q32[2], q32[3]);
    const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16, q16b),
                                                   _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qg), q8);
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(q32[0], q32[1]), _mm256_add_epi32(q32[2], q32[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    sum = _mm_cvtsi128_si32(s4);
#else
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xg[i]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    for (int i = 0; i < 32; ++i) {
      qg[i] = static_cast<int8_t>(std::nearbyint(xg[i] * id));  // ties to even
      sum += qg[i];
    }
#endif
    out.d[g] = d;
    out.dsum[g] = d * static_cast<float>(sum);
  }
}

}  // namespace ggml_blocks
