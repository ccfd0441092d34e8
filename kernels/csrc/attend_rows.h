// The two loops of the fused decode step's attention (decoder_step.cpp: attend_segments) over a
// run of cached rows:
//
// - logits: p[j, t] = (q_j . k_t) * scale for the G query heads j of a KV head. The plain loop's
//   dot (`#pragma omp simd reduction`, GCC) sums in 8 fp32 lanes, lane i taking products
//   i, i + 8, ... by FMA, then adds the lanes one after another, starting from 0. Here 8 keys
//   are taken at once: 8 independent FMA chains instead of one, and the lanes of the 8 sums
//   added one after another by vector adds after a transpose (the same additions, 8 keys wide).
// - values: o_j += p[j, t] * v_t, token after token (one FMA each, as GCC contracts the plain
//   loop): here the outputs of up to 4 heads stay in registers across the run's tokens instead
//   of being loaded and stored at each token.
//
// Rows are fp32, fp16 or bf16 (widened exactly, kv_rows.h). With AVX2 and FMA and a head width
// a multiple of 8 these run, in the plain loops' order of sums (the same bits); elsewhere the
// caller keeps its plain loops (`fast_rows`). Where the build has AVX-512 (MSA_AVX512), the
// 512-bit loops of attend_rows_avx512.h run instead where the shapes allow: the same bits.
#pragma once

#include <torch/extension.h>

#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define MSA_ATTEND_ROWS 1
#endif

namespace attend_rows {

#ifdef MSA_ATTEND_ROWS

inline bool fast_rows(int64_t d) { return d % 8 == 0; }

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const at::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// s[r] (lanes 0..7 of key r) -> for each r, ((0 + s[r][0]) + s[r][1]) + ... + s[r][7], as
// lane r of the result.
inline __m256 lane_sums(const __m256 s[8]) {
  const __m256 a0 = _mm256_unpacklo_ps(s[0], s[1]), a1 = _mm256_unpackhi_ps(s[0], s[1]);
  const __m256 a2 = _mm256_unpacklo_ps(s[2], s[3]), a3 = _mm256_unpackhi_ps(s[2], s[3]);
  const __m256 a4 = _mm256_unpacklo_ps(s[4], s[5]), a5 = _mm256_unpackhi_ps(s[4], s[5]);
  const __m256 a6 = _mm256_unpacklo_ps(s[6], s[7]), a7 = _mm256_unpackhi_ps(s[6], s[7]);
  const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
  const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
  const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
  const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
  // lane l of key r, for keys 0..7: t[l]
  const __m256 t[8] = {_mm256_permute2f128_ps(b0, b4, 0x20), _mm256_permute2f128_ps(b1, b5, 0x20),
                       _mm256_permute2f128_ps(b2, b6, 0x20), _mm256_permute2f128_ps(b3, b7, 0x20),
                       _mm256_permute2f128_ps(b0, b4, 0x31), _mm256_permute2f128_ps(b1, b5, 0x31),
                       _mm256_permute2f128_ps(b2, b6, 0x31), _mm256_permute2f128_ps(b3, b7, 0x31)};
  __m256 sum = _mm256_add_ps(_mm256_setzero_ps(), t[0]);
  for (int l = 1; l < 8; ++l) sum = _mm256_add_ps(sum, t[l]);
  return sum;
}

// p[j * stride + t] = (q_j . k_t) * scale for t < len (rows k + t * d), j < g; q [g, d].
template <typename T>
void logits8(const float* q, int64_t g, int64_t d, const T* k, int64_t len, float scale, float* p, int64_t stride) {
  const __m256 s8 = _mm256_set1_ps(scale);
  int64_t t = 0;
  for (; t + 8 <= len; t += 8) {
    const T* rows = k + t * d;
    for (int64_t j = 0; j < g; ++j) {
      const float* qj = q + j * d;
      __m256 acc[8];
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; c += 8) {
        const __m256 qc = _mm256_loadu_ps(qj + c);
        for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(qc, load8(rows + r * d + c), acc[r]);
      }
      _mm256_storeu_ps(p + j * stride + t, _mm256_mul_ps(lane_sums(acc), s8));
    }
  }
  for (; t < len; ++t) {
    const T* row = k + t * d;
    for (int64_t j = 0; j < g; ++j) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * d + c), load8(row + c), acc);
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc);
      float sum = 0.f;
      for (int l = 0; l < 8; ++l) sum += lanes[l];
      p[j * stride + t] = sum * scale;
    }
  }
}

// o [H, d] (heads j0..j0+H-1 of o_all [g, d]) += sum over t < len of p[j, t] * v_t, token by
// token, for the C chunks of 8 values from c0: H * C accumulators, kept in registers across the
// tokens (C a constant: with a count known only at run time GCC kept them in memory).
template <int H, int C, typename T>
void add_value_chunks(const float* p, int64_t stride, int64_t j0, int64_t c0, int64_t d, const T* v, int64_t len,
                      float* o_all) {
  __m256 acc[H][C];
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) acc[h][c] = _mm256_loadu_ps(o_all + (j0 + h) * d + c0 + 8 * c);
  for (int64_t t = 0; t < len; ++t) {
    const T* row = v + t * d + c0;
    __m256 w[H];
    for (int h = 0; h < H; ++h) w[h] = _mm256_set1_ps(p[(j0 + h) * stride + t]);
    for (int c = 0; c < C; ++c) {
      const __m256 x = load8(row + 8 * c);
      for (int h = 0; h < H; ++h) acc[h][c] = _mm256_fmadd_ps(w[h], x, acc[h][c]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(o_all + (j0 + h) * d + c0 + 8 * c, acc[h][c]);
}

// The same over the whole head width, 8 / H chunks at a time.
template <int H, typename T>
void add_values_of(const float* p, int64_t stride, int64_t j0, int64_t d, const T* v, int64_t len, float* o_all) {
  constexpr int C = 8 / H;
  int64_t c0 = 0;
  for (; c0 + 8 * C <= d; c0 += 8 * C) add_value_chunks<H, C>(p, stride, j0, c0, d, v, len, o_all);
  for (; c0 < d; c0 += 8) add_value_chunks<H, 1>(p, stride, j0, c0, d, v, len, o_all);
}

// o [g, d] += sum over t < len of p[j, t] * v_t for every head j < g.
template <typename T>
void add_values8(const float* p, int64_t stride, int64_t g, int64_t d, const T* v, int64_t len, float* o) {
  int64_t j = 0;
  for (; j + 4 <= g; j += 4) add_values_of<4>(p, stride, j, d, v, len, o);
  for (; j + 2 <= g; j += 2) add_values_of<2>(p, stride, j, d, v, len, o);
  for (; j < g; ++j) add_values_of<1>(p, stride, j, d, v, len, o);
}

}  // namespace attend_rows

#ifdef MSA_AVX512
#include "attend_rows_avx512.h"
#endif

namespace attend_rows {

// The loops the build and the shapes allow (the same bits whichever runs):
// p[j * stride + t] = (q_j . k_t) * scale ...
template <typename T>
void logits(const float* q, int64_t g, int64_t d, const T* k, int64_t len, float scale, float* p, int64_t stride) {
  int64_t done = 0;
#ifdef MSA_AVX512
  if (wide::fits_logits(g, d)) done = wide::logits(q, g, d, k, len, scale, p, stride);
#endif
  logits8(q, g, d, k + done * d, len - done, scale, p + done, stride);
}

// ... and o [g, d] += sum over t < len of p[j, t] * v_t.
template <typename T>
void add_values(const float* p, int64_t stride, int64_t g, int64_t d, const T* v, int64_t len, float* o) {
#ifdef MSA_AVX512
  if (wide::fits_values(d)) return wide::add_values(p, stride, g, d, v, len, o);
#endif
  add_values8(p, stride, g, d, v, len, o);
}

#else

inline bool fast_rows(int64_t) { return false; }

template <typename T>
void logits(const float*, int64_t, int64_t, const T*, int64_t, float, float*, int64_t) {}

template <typename T>
void add_values(const float*, int64_t, int64_t, int64_t, const T*, int64_t, float*) {}

#endif

}  // namespace attend_rows
