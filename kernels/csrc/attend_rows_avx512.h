// attend_rows.h's two loops on 512-bit vectors: included by attend_rows.h where the build has
// AVX-512 (MSA_AVX512), these functions alone compiled for it.
//
// Why: profiled on the Llama-3.1-8B shape at 32K tokens (2-core AMD EPYC), a decode step's
// attention over its ~54 selected blocks a layer took a quarter of the step: the 256-bit logits
// widened each fp16 key once per query head (G conversions of every key), and the values loop
// kept its accumulators in memory. Here 16 keys are widened once into a buffer that the G heads
// read, and both loops take 16 values an instruction.
//
// The same bits as the 256-bit loops. Logits: a vector holds two keys' 8-lane sums side by side
// (key 2i in the lower half, 2i + 1 in the upper), each lane taking the same products in the
// same order as attend_rows::logits8's lane, and the halves go through the same lane_sums.
// Values: o_j += p[j, t] * v_t token by token, one FMA each, 16 values an instruction.
#pragma once

#include <immintrin.h>

#include <cstdint>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")

namespace attend_rows::wide {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const at::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

inline __m512 halves(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}
inline __m256 lower(__m512 x) { return _mm512_castps512_ps256(x); }
inline __m256 upper(__m512 x) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)); }

// 8 values at a and 8 at b, widened: a's in the lower half, b's in the upper.
inline __m256i halves16(const void* a, const void* b) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(a))),
                                 _mm_loadu_si128(static_cast<const __m128i*>(b)), 1);
}
inline __m512 pair8(const float* a, const float* b) { return halves(_mm256_loadu_ps(a), _mm256_loadu_ps(b)); }
inline __m512 pair8(const at::Half* a, const at::Half* b) { return _mm512_cvtph_ps(halves16(a, b)); }
inline __m512 pair8(const at::BFloat16* a, const at::BFloat16* b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves16(a, b)), 16));
}

constexpr int64_t kKeys = 16;       // keys a group: 8 pairs, 8 independent FMA chains
constexpr int64_t kMaxWidth = 256;  // the widest head, and
constexpr int64_t kMaxGroup = 16;   // the most query heads a KV head, the buffers hold

inline bool fits_logits(int64_t g, int64_t d) { return d % 8 == 0 && d <= kMaxWidth && g <= kMaxGroup; }
inline bool fits_values(int64_t d) { return d % 16 == 0; }

// p[j * stride + t] = (q_j . k_t) * scale for the first keys t of k (rows k + t * d), whole
// groups of kKeys, j < g; q [g, d]. Returns how many keys it did: the caller does the rest.
template <typename T>
int64_t logits(const float* q, int64_t g, int64_t d, const T* k, int64_t len, float scale, float* p, int64_t stride) {
  const int64_t nc = d / 8;  // chunks of 8 a row
  alignas(64) float qq[kMaxGroup * 2 * kMaxWidth];  // q_j's chunks, each in both halves
  alignas(64) float keys[kKeys * kMaxWidth];        // pair i's chunk c at (i * nc + c) * 16
  for (int64_t j = 0; j < g; ++j)
    for (int64_t c = 0; c < nc; ++c) _mm512_store_ps(qq + (j * nc + c) * 16, pair8(q + j * d + 8 * c, q + j * d + 8 * c));
  const __m256 s8 = _mm256_set1_ps(scale);
  int64_t t = 0;
  for (; t + kKeys <= len; t += kKeys) {
    const T* rows = k + t * d;
    for (int i = 0; i < kKeys / 2; ++i)
      for (int64_t c = 0; c < nc; ++c)
        _mm512_store_ps(keys + (i * nc + c) * 16, pair8(rows + 2 * i * d + 8 * c, rows + (2 * i + 1) * d + 8 * c));
    for (int64_t j = 0; j < g; ++j) {
      const float* qj = qq + j * nc * 16;
      __m512 acc[kKeys / 2];
      for (int i = 0; i < kKeys / 2; ++i) acc[i] = _mm512_setzero_ps();
      for (int64_t c = 0; c < nc; ++c) {
        const __m512 qc = _mm512_load_ps(qj + c * 16);
        for (int i = 0; i < kKeys / 2; ++i) acc[i] = _mm512_fmadd_ps(qc, _mm512_load_ps(keys + (i * nc + c) * 16), acc[i]);
      }
      for (int half = 0; half < kKeys / 8; ++half) {  // 8 keys' sums at a time, as logits8 adds them
        __m256 sums[8];
        for (int i = 0; i < 4; ++i) {
          sums[2 * i] = lower(acc[4 * half + i]);
          sums[2 * i + 1] = upper(acc[4 * half + i]);
        }
        _mm256_storeu_ps(p + j * stride + t + 8 * half, _mm256_mul_ps(lane_sums(sums), s8));
      }
    }
  }
  return t;
}

// o [H, d] (heads j0.. of o_all [g, d]) += sum over t < len of p[j, t] * v_t for the C chunks
// of 16 values from c0, H * C accumulators in registers across the tokens.
template <int H, int C, typename T>
void add_value_chunks(const float* p, int64_t stride, int64_t j0, int64_t c0, int64_t d, const T* v, int64_t len,
                      float* o_all) {
  __m512 acc[H][C];
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) acc[h][c] = _mm512_loadu_ps(o_all + (j0 + h) * d + c0 + 16 * c);
  for (int64_t t = 0; t < len; ++t) {
    const T* row = v + t * d + c0;
    __m512 w[H];
    for (int h = 0; h < H; ++h) w[h] = _mm512_set1_ps(p[(j0 + h) * stride + t]);
    for (int c = 0; c < C; ++c) {
      const __m512 x = load16(row + 16 * c);
      for (int h = 0; h < H; ++h) acc[h][c] = _mm512_fmadd_ps(w[h], x, acc[h][c]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o_all + (j0 + h) * d + c0 + 16 * c, acc[h][c]);
}

// The same over the whole head width: up to 16 accumulators (4 heads x 4 chunks) at a time.
template <int H, typename T>
void add_values_of(const float* p, int64_t stride, int64_t j0, int64_t d, const T* v, int64_t len, float* o) {
  constexpr int C = 16 / H > 4 ? 4 : 16 / H;
  int64_t c0 = 0;
  for (; c0 + 16 * C <= d; c0 += 16 * C) add_value_chunks<H, C>(p, stride, j0, c0, d, v, len, o);
  for (; c0 < d; c0 += 16) add_value_chunks<H, 1>(p, stride, j0, c0, d, v, len, o);
}

// o [g, d] += sum over t < len of p[j, t] * v_t for every head j < g.
template <typename T>
void add_values(const float* p, int64_t stride, int64_t g, int64_t d, const T* v, int64_t len, float* o) {
  int64_t j = 0;
  for (; j + 4 <= g; j += 4) add_values_of<4>(p, stride, j, d, v, len, o);
  for (; j + 2 <= g; j += 2) add_values_of<2>(p, stride, j, d, v, len, o);
  for (; j < g; ++j) add_values_of<1>(p, stride, j, d, v, len, o);
}

}  // namespace attend_rows::wide

#pragma GCC pop_options
