// Rows of the K/V stores as the fused decode step reads and writes them: fp32 as they are, fp16
// widened by F16C (8 values an instruction), bf16 by shifting its 16 bits into the high half of
// an fp32 (exact, as PyTorch widens it); the new token's rows written in the stores' type,
// rounded to nearest even as PyTorch's `.to()` rounds them, so both paths store the same bits.
// Attention then computes in fp32 on the widened rows.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace kv_rows {

// The n values of `row` as fp32: the row itself, or `buf` filled with them.
inline const float* widen(const float* row, float* /*buf*/, int64_t /*n*/) { return row; }

inline const float* widen(const at::Half* row, float* buf, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i))));
#endif
  for (; i < n; ++i) buf[i] = static_cast<float>(row[i]);
  return buf;
}

inline const float* widen(const at::BFloat16* row, float* buf, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
    _mm256_storeu_ps(buf + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
#endif
  for (; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(row[i].x) << 16;
    std::memcpy(buf + i, &bits, sizeof bits);
  }
  return buf;
}

// dst[0..n) = x[0..n) in the stores' type (c10's conversions round to nearest even).
template <typename T>
inline void narrow(const float* x, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(x[i]);
}

// int8 K/V (kv_int8.py): x rounded in place to its int8 grid, q = round(x / s) in [-127, 127]
// with s = max|x| / 127, x = q * s; returns s. The same operations in the same order as
// kv_int8.round_rows, so the stored values are the same bits.
inline float round_to_int8_grid(float* x, int64_t n) {
  float top = 0.f;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, std::abs(x[i]));
  const float scale = top / 127.f;
  const float safe = std::max(scale, std::numeric_limits<float>::min());
  for (int64_t i = 0; i < n; ++i) {
    const float q = std::min(127.f, std::max(-127.f, std::nearbyint(x[i] / safe)));
    x[i] = q * scale;
  }
  return scale;
}

}  // namespace kv_rows
