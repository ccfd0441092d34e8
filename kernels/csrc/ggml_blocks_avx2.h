// The block kernels with AVX2 (and AVX-512 VNNI or AVX-VNNI where the build asks for them): see
// ggml_blocks.h.
#pragma once

#include "ggml_block_types.h"
#include "ggml_input_q8.h"

namespace ggml_blocks {

#define GGML_INLINE inline __attribute__((always_inline))

// Each type's bytes unpacked with a few vector operations (llama.cpp's AVX2 idioms).

// Q4_K: the 6-bit scales (bytes 0..7) and mins (bytes 8..15) of the 8 sub-blocks (llama.cpp's
// utmp shuffle of get_scale_min_k4).
GGML_INLINE __m128i q4k_scales_mins(const uint8_t* b) {
  uint32_t u[4];
  std::memcpy(u, b + 4, 12);
  u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
  const uint32_t mins_low = u[1] & 0x3f3f3f3f;
  u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
  u[2] = mins_low;
  u[0] &= 0x3f3f3f3f;
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
}

// Q4_K: values 64j..64j+63 as 0..15: sub-block 2j in the low nibbles of 32 bytes, 2j+1 high.
GGML_INLINE void q4k_values(const uint8_t* b, int j, __m256i out[2]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * j));
  out[0] = _mm256_and_si256(v, m4);
  out[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
}

// Q6_K: values 128n..128n+127 as stored, q + 32 (0..63), 32 at a time.
GGML_INLINE void q6k_values(const uint8_t* b, int n, __m256i out[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n));
  const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n + 32));
  const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * n));
  const __m256i low[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                          _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                          _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
  for (int part = 0; part < 4; ++part) {
    const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * part), m3), 4);
    out[part] = _mm256_or_si256(low[part], high);
  }
}

// Q5_0: the 32 values as int8 q - 16; the 32 high bits to bytes (llama.cpp's
// bytes_from_bits_32), then the nibble where the high bit is set, else the nibble | 0xF0.
GGML_INLINE __m256i q5_0_values(const uint8_t* b) {
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuffle);
  bits = _mm256_cmpeq_epi8(_mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
  const __m256i high = _mm256_andnot_si256(bits, _mm256_set1_epi8(static_cast<char>(0xF0)));
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6));
  const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(0x0F));
  return _mm256_or_si256(nib, high);
}

// ---- fp32 values of a block (prefill's tiles) ----

// Each 16 values as fp32 scale * q + min.
GGML_INLINE void store16(__m128i q, float scale, float min, float* y) {
  const __m256 s = _mm256_set1_ps(scale), m = _mm256_set1_ps(min);
  const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q, q)));
  _mm256_storeu_ps(y, _mm256_fmadd_ps(a, s, m));
  _mm256_storeu_ps(y + 8, _mm256_fmadd_ps(c, s, m));
}
#ifdef MSA_AVX512
// 16 fp32 values rounded to bf16 (their bits), to nearest with ties to even; a NaN stays a
// (quiet) NaN: as PyTorch's .to(torch.bfloat16).
GGML_INLINE __m256i bf16_bits16(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}

// Each 16 values as store16 computes them in fp32, then rounded to bf16 (prefill's bf16 tiles).
GGML_INLINE void store16(__m128i q, float scale, float min, uint16_t* y) {
  const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y),
                      bf16_bits16(_mm512_fmadd_ps(a, _mm512_set1_ps(scale), _mm512_set1_ps(min))));
}
#endif

template <typename Out>
GGML_INLINE void store32(__m256i q, float scale_low, float scale_high, float min, Out* y) {
  store16(_mm256_castsi256_si128(q), scale_low, min, y);
  store16(_mm256_extracti128_si256(q, 1), scale_high, min, y + 16);
}

// A block's values: fp32 (Out float), or, with AVX-512, those values rounded to bf16 (uint16_t).
template <int64_t type, typename Out>
void dequantize_block_of(const uint8_t* b, Out* y) {
  if constexpr (type == Q4_K) {
    const __m128i bytes = q4k_scales_mins(b);
    alignas(32) float sc[8], mn[8];
    _mm256_store_ps(sc, _mm256_mul_ps(_mm256_set1_ps(half_at(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes))));
    const __m256 m8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(bytes, bytes)));
    _mm256_store_ps(mn, _mm256_mul_ps(_mm256_set1_ps(-half_at(b + 2)), m8));
    for (int j = 0; j < 4; ++j) {
      __m256i q[2];
      q4k_values(b, j, q);
      for (int h = 0; h < 2; ++h) store32(q[h], sc[2 * j + h], sc[2 * j + h], mn[2 * j + h], y + 64 * j + 32 * h);
    }
  } else if constexpr (type == Q6_K) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_at(b + 208);
    for (int n = 0; n < 2; ++n) {
      __m256i q[4];
      q6k_values(b, n, q);
      for (int part = 0; part < 4; ++part) {
        const int first = 128 * n + 32 * part;
        store32(_mm256_sub_epi8(q[part], _mm256_set1_epi8(32)), d * static_cast<float>(sc[first / 16]),
                d * static_cast<float>(sc[first / 16 + 1]), 0.f, y + first);
      }
    }
  } else if constexpr (type == Q5_0) {
    store32(q5_0_values(b), half_at(b), half_at(b), 0.f, y);
  } else {  // Q8_0
    store32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), half_at(b), half_at(b), 0.f, y);
  }
}

template <typename Out>
void dequantize_block(int64_t type, const uint8_t* b, Out* y) {
  switch (type) {
    case Q4_K: return dequantize_block_of<Q4_K>(b, y);
    case Q6_K: return dequantize_block_of<Q6_K>(b, y);
    case Q5_0: return dequantize_block_of<Q5_0>(b, y);
    default: return dequantize_block_of<Q8_0>(b, y);
  }
}

GGML_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- one row times an fp32 input, the exact weights (output heads) ----

// Q5_0 and Q8_0 (one scale a block: a tied head's embedding is often Q8_0) straight from their
// int8 values; the others dequantized into a buffer (L1) and multiplied there. Two FMA chains.
inline float row_dot_fp32(int64_t type, const uint8_t* row, const float* x, int64_t k) {
  const int64_t nv = block_values(type), bb = block_bytes(type);
  alignas(32) float w[256];
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  if (type == Q5_0 || type == Q8_0) {
    for (int64_t blk = 0; blk < k / 32; ++blk) {
      const uint8_t* b = row + blk * bb;
      const __m256i q = type == Q5_0 ? q5_0_values(b) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
      const float* xb = x + blk * 32;
      __m256 p0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm256_castsi256_si128(q))), _mm256_loadu_ps(xb));
      __m256 p1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))),
                                _mm256_loadu_ps(xb + 16));
      const __m128i lo = _mm_unpackhi_epi64(_mm256_castsi256_si128(q), _mm256_castsi256_si128(q));
      const __m128i hi = _mm_unpackhi_epi64(_mm256_extracti128_si256(q, 1), _mm256_extracti128_si256(q, 1));
      p0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(xb + 8), p0);
      p1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(xb + 24), p1);
      const __m256 d = _mm256_set1_ps(half_at(b));
      acc0 = _mm256_fmadd_ps(d, p0, acc0);
      acc1 = _mm256_fmadd_ps(d, p1, acc1);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
  }
  for (int64_t blk = 0; blk < k / nv; ++blk) {
    dequantize_block(type, row + blk * bb, w);
    for (int64_t i = 0; i < nv; i += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_load_ps(w + i), _mm256_loadu_ps(x + blk * nv + i), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_load_ps(w + i + 8), _mm256_loadu_ps(x + blk * nv + i + 8), acc1);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// ---- one row times a quantized input (decode's matvec) ----

// Decode's rows are read once, as a stream: each block asks for the bytes 4 KB ahead of it
// (an 8B-shape sweep of every matvec ~15% faster than the hardware's prefetch alone, 2 cores;
// 2 and 8 KB measured less). A prefetch past the mapping's end never faults.
constexpr int64_t PREFETCH_AHEAD = 4096;
GGML_INLINE void prefetch_ahead(const uint8_t* b, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64)
    _mm_prefetch(reinterpret_cast<const char*>(b + PREFETCH_AHEAD + at), _MM_HINT_T0);
}

// Q4_K block `blk` of a row (b, its scales and mins `bytes`): mins plus its min j times the
// input's sum over sub-block j (its two sums of 16), scaled, in 4 fp32 lanes.
GGML_INLINE __m128 q4k_add_mins(const uint8_t* b, __m128i bytes, const InputQ8& x, int64_t blk, __m128 mins) {
  const __m256i sums16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums.data() + blk * 16));
  const __m128i sums32 = _mm_hadd_epi16(_mm256_castsi256_si128(sums16), _mm256_extracti128_si256(sums16, 1));
  const __m128i m = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_unpackhi_epi64(bytes, bytes)), sums32);
  return _mm_fmadd_ps(_mm_set1_ps(half_at(b + 2) * x.d[blk]), _mm_cvtepi32_ps(m), mins);
}

// Unsigned bytes u times signed bytes s, summed by 4 into int32 lanes: one VNNI instruction,
// or maddubs (pairs into int16: no saturation here, |u| <= 128 and |s| <= 127) then madd.
// The build's macros choose (g++ does not define __AVX512VNNI__ under `#pragma GCC target`).
GGML_INLINE __m256i dot4(__m256i u, __m256i s) {
#if defined(MSA_GGML_VNNI) && defined(MSA_AVX512)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(MSA_GGML_VNNI)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Signed weights q times x: |q| times x with q's sign (llama.cpp's mul_sum_i8_pairs).
GGML_INLINE __m256i dot4_signed(__m256i q, __m256i x) {
  return dot4(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
}

GGML_INLINE __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// One row (k weights) times the quantized input (ggml_input_q8.h), llama.cpp's vec_dot
// kernels: the integer sums of weight q times input q, exact, scaled in fp32 once a block of
// 256 (Q4_K, Q6_K: their sub-block scales multiply in integers) or of 32 (Q5_0, Q8_0). Two
// accumulators where the blocks are short: two chains of dependent FMAs.
template <int64_t type>
float row_dot_of(const uint8_t* row, const InputQ8& x, int64_t k) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const int8_t* xq = x.q.data();
  if constexpr (type == Q4_K) {
    __m128 mins = _mm_setzero_ps();
    for (int64_t blk = 0; blk < k / 256; ++blk) {
      const uint8_t* b = row + blk * 144;
      prefetch_ahead(b, 144);
      const int8_t* xb = xq + blk * 256;
      const __m128i bytes = q4k_scales_mins(b);
      mins = q4k_add_mins(b, bytes, x, blk, mins);
      alignas(16) int16_t sc[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(sc), _mm_cvtepu8_epi16(bytes));
      __m256i sum = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {
        __m256i q[2];
        q4k_values(b, j, q);
        const __m256i p0 = _mm256_maddubs_epi16(q[0], load32(xb + 64 * j));
        const __m256i p1 = _mm256_maddubs_epi16(q[1], load32(xb + 64 * j + 32));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * j])));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * j + 1])));
      }
      acc0 = _mm256_fmadd_ps(_mm256_set1_ps(half_at(b) * x.d[blk]), _mm256_cvtepi32_ps(sum), acc0);
    }
    __m128 lanes = _mm_sub_ps(_mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1)), mins);
    lanes = _mm_add_ps(lanes, _mm_movehl_ps(lanes, lanes));
    return _mm_cvtss_f32(_mm_add_ss(lanes, _mm_movehdup_ps(lanes)));
  } else if constexpr (type == Q6_K) {
    // per group of 32 values, its two 16s' scales as 8 int16 lanes each
    __m128i pick[4];
    for (int c = 0; c < 4; ++c)
      pick[c] = _mm_or_si128(_mm_set1_epi8(static_cast<char>(2 * c)),
                             _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    for (int64_t blk = 0; blk < k / 256; ++blk) {
      const uint8_t* b = row + blk * 210;
      prefetch_ahead(b, 210);
      const int8_t* xb = xq + blk * 256;
      const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
      // the values are stored as q + 32 (0..63, unsigned for maddubs): minus 32 x the sums
      const __m256i sums16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums.data() + blk * 16));
      __m256i sum = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), sums16), 5);
      sum = _mm256_sub_epi32(_mm256_setzero_si256(), sum);
      for (int n = 0; n < 2; ++n) {
        __m256i q[4];
        q6k_values(b, n, q);
        const __m128i sc8 = n == 0 ? scales : _mm_srli_si128(scales, 8);
        for (int part = 0; part < 4; ++part) {
          const __m256i p = _mm256_maddubs_epi16(q[part], load32(xb + 128 * n + 32 * part));
          const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick[part]));
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, sc));
        }
      }
      acc0 = _mm256_fmadd_ps(_mm256_set1_ps(half_at(b + 208) * x.d[blk]), _mm256_cvtepi32_ps(sum), acc0);
    }
  } else {  // Q5_0, Q8_0: one group of 32 a block
    const int64_t bb = block_bytes(type);
    auto product = [&](int64_t blk) {
      const uint8_t* b = row + blk * bb;
      prefetch_ahead(b, bb);
      const __m256i q =
          type == Q5_0 ? q5_0_values(b) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
      return std::make_pair(_mm256_cvtepi32_ps(dot4_signed(q, load32(xq + blk * 32))),
                            _mm256_set1_ps(half_at(b) * x.d[blk]));
    };
    int64_t blk = 0;
    for (; blk + 1 < k / 32; blk += 2) {
      const auto [p0, s0] = product(blk);
      const auto [p1, s1] = product(blk + 1);
      acc0 = _mm256_fmadd_ps(p0, s0, acc0);
      acc1 = _mm256_fmadd_ps(p1, s1, acc1);
    }
    if (blk < k / 32) {
      const auto [p0, s0] = product(blk);
      acc0 = _mm256_fmadd_ps(p0, s0, acc0);
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

}  // namespace ggml_blocks

#if defined(MSA_AVX512) && defined(MSA_GGML_VNNI)
#include "ggml_blocks_avx512.h"
#endif

namespace ggml_blocks {

inline float row_dot(int64_t type, const uint8_t* row, const InputQ8& x, int64_t k) {
  switch (type) {
#if defined(MSA_AVX512) && defined(MSA_GGML_VNNI)
    case Q4_K: return row_dot_q4k_512(row, x, k);
    case Q6_K: return row_dot_q6k_512(row, x, k);
    case Q5_0: return row_dot_small_blocks_512<Q5_0>(row, x, k);
    default: return row_dot_small_blocks_512<Q8_0>(row, x, k);
#else
    case Q4_K: return row_dot_of<Q4_K>(row, x, k);
    case Q6_K: return row_dot_of<Q6_K>(row, x, k);
    case Q5_0: return row_dot_of<Q5_0>(row, x, k);
    default: return row_dot_of<Q8_0>(row, x, k);
#endif
  }
}

}  // namespace ggml_blocks
