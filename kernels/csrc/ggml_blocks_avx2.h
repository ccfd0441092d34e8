// The block kernels with AVX2 (and AVX-512 where the build asks for it): see ggml_blocks.h.
#pragma once

#include "ggml_block_types.h"

namespace ggml_blocks {

// The block's values as 16 int8 lanes at a time, with the scale and min of those 16:
// visit(q16, scale, min, first value). Each type's bytes are unpacked with a few vector
// operations (llama.cpp's AVX2 idioms).
#define GGML_INLINE inline __attribute__((always_inline))

// Specialized per type (a template argument, so that each product's inner loop is inlined
// whole: the visitor's accumulators stay in registers).
// Q4_K's also calls mins(8 fp32 mins of its sub-blocks) once a block.
template <int64_t type, typename F, typename M>
GGML_INLINE void visit_block(const uint8_t* b, F&& visit, M&& mins) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  if constexpr (type == Q4_K) {
    // the 6-bit scales and mins as 8 bytes each (llama.cpp's utmp shuffle of get_scale_min_k4)
    uint32_t u[4];
    std::memcpy(u, b + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    const uint32_t mins_low = u[1] & 0x3f3f3f3f;
    u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    u[2] = mins_low;
    u[0] &= 0x3f3f3f3f;
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    alignas(32) float sc[8], mn[8];
    _mm256_store_ps(sc, _mm256_mul_ps(_mm256_set1_ps(half_at(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes))));
    const __m256 m8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(bytes, bytes)));
    _mm256_store_ps(mn, _mm256_mul_ps(_mm256_set1_ps(-half_at(b + 2)), m8));
    mins(_mm256_load_ps(mn));
    for (int j = 0; j < 4; ++j) {  // 32 bytes: sub-block 2j in the low nibbles, 2j+1 high
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * j));
      const __m256i halves[2] = {_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)};
      for (int h = 0; h < 2; ++h) {
        const int sub = 2 * j + h;
        visit(_mm256_castsi256_si128(halves[h]), sc[sub], mn[sub], 32 * sub);
        visit(_mm256_extracti128_si256(halves[h], 1), sc[sub], mn[sub], 32 * sub + 16);
      }
    }
  } else if constexpr (type == Q6_K) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_at(b + 208);
    const __m256i m3 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
    for (int n = 0; n < 2; ++n) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * n));
      const __m256i high[4] = {
          _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4),
          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4),
          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4),
          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4)};
      const __m256i low[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                              _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
      for (int part = 0; part < 4; ++part) {
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low[part], high[part]), m32);
        const int first = 128 * n + 32 * part;
        visit(_mm256_castsi256_si128(q), d * static_cast<float>(sc[first / 16]), 0.f, first);
        visit(_mm256_extracti128_si256(q, 1), d * static_cast<float>(sc[first / 16 + 1]), 0.f, first + 16);
      }
    }
  } else if constexpr (type == Q5_0) {  // the 32 high bits to bytes, llama.cpp's bytes_from_bits_32
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuffle);
    bits = _mm256_cmpeq_epi8(_mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
    // q - 16 as int8: the nibble where the high bit is set, else the nibble | 0xF0
    const __m256i high = _mm256_andnot_si256(bits, _mm256_set1_epi8(static_cast<char>(0xF0)));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6));
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), m4);
    const __m256i q = _mm256_or_si256(nib, high);
    const float d = half_at(b);
    visit(_mm256_castsi256_si128(q), d, 0.f, 0);
    visit(_mm256_extracti128_si256(q, 1), d, 0.f, 16);
  } else {  // Q8_0
    const float d = half_at(b);
    visit(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)), d, 0.f, 0);
    visit(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18)), d, 0.f, 16);
  }
}

#ifdef __AVX512F__
// 16 int8 lanes times x[0..16): 16 fp32 products (one widening, one conversion, one multiply).
using Sums = __m512;
GGML_INLINE Sums zero_sums() { return _mm512_setzero_ps(); }
GGML_INLINE Sums scaled_dot16(float scale, __m128i q, const float* x, Sums acc) {
  const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_loadu_ps(x));
  return _mm512_fmadd_ps(_mm512_set1_ps(scale), p, acc);
}
GGML_INLINE float hsum(Sums v) { return _mm512_reduce_add_ps(v); }
GGML_INLINE Sums add_sums(Sums a, Sums b) { return _mm512_add_ps(a, b); }
#else
// 16 int8 lanes times x[0..16) as 8 fp32 partial sums.
using Sums = __m256;
GGML_INLINE Sums zero_sums() { return _mm256_setzero_ps(); }
GGML_INLINE Sums scaled_dot16(float scale, __m128i q, const float* x, Sums acc) {
  const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q, q)));
  const __m256 p = _mm256_fmadd_ps(b, _mm256_loadu_ps(x + 8), _mm256_mul_ps(a, _mm256_loadu_ps(x)));
  return _mm256_fmadd_ps(_mm256_set1_ps(scale), p, acc);
}
GGML_INLINE float hsum(Sums v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
GGML_INLINE Sums add_sums(Sums a, Sums b) { return _mm256_add_ps(a, b); }
#endif

// One row (k weights) times x [k]; xs: x's sums over groups of 32 (Q4_K's mins). Two
// accumulators, for the two halves of each group of 32: two chains of dependent FMAs.
template <int64_t type>
float row_dot_of(const uint8_t* row, const float* x, const float* xs, int64_t k) {
  constexpr int64_t nv = type == Q4_K || type == Q6_K ? 256 : 32;
  const int64_t bb = block_bytes(type);
  Sums acc[2] = {zero_sums(), zero_sums()};
  __m256 mins = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < k / nv; ++blk) {
    const float* xb = x + blk * nv;
    visit_block<type>(
        row + blk * bb,
        [&](__m128i q, float scale, float, int first) {
          Sums& a = acc[(first / 16) & 1];
          a = scaled_dot16(scale, q, xb + first, a);
        },
        [&](__m256 mn) { mins = _mm256_fmadd_ps(mn, _mm256_loadu_ps(xs + blk * 8), mins); });
  }
  float low[8];
  _mm256_storeu_ps(low, mins);
  float m = 0.f;
  for (float v : low) m += v;
  return hsum(add_sums(acc[0], acc[1])) + m;
}

template <int64_t type>
void dequantize_block_of(const uint8_t* b, float* y) {
  visit_block<type>(
      b,
      [&](__m128i q, float scale, float min, int first) {
        const __m256 s = _mm256_set1_ps(scale), m = _mm256_set1_ps(min);
        const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q, q)));
        _mm256_storeu_ps(y + first, _mm256_fmadd_ps(a, s, m));
        _mm256_storeu_ps(y + first + 8, _mm256_fmadd_ps(c, s, m));
      },
      [](__m256) {});
}

inline float row_dot(int64_t type, const uint8_t* row, const float* x, const float* xs, int64_t k) {
  switch (type) {
    case Q4_K: return row_dot_of<Q4_K>(row, x, xs, k);
    case Q6_K: return row_dot_of<Q6_K>(row, x, xs, k);
    case Q5_0: return row_dot_of<Q5_0>(row, x, xs, k);
    default: return row_dot_of<Q8_0>(row, x, xs, k);
  }
}

inline void dequantize_block(int64_t type, const uint8_t* b, float* y) {
  switch (type) {
    case Q4_K: return dequantize_block_of<Q4_K>(b, y);
    case Q6_K: return dequantize_block_of<Q6_K>(b, y);
    case Q5_0: return dequantize_block_of<Q5_0>(b, y);
    default: return dequantize_block_of<Q8_0>(b, y);
  }
}

}  // namespace ggml_blocks
