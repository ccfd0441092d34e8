// A row of channels as stored in a KV cache (fp32, fp16 or bf16) widened to fp32: the first
// step of every kernel that reads cached keys or values on the CPU (rotate_back.h, the bf16
// attention's packing in attention_bf16_keys.h). Portable; fp16 through F16C where the build has
// it, bf16 by a shift the compiler vectorizes.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#ifdef __F16C__
#include <immintrin.h>
#endif

namespace cache_rows {

inline void widen(const float* x, int64_t d, float* out) { std::memcpy(out, x, d * sizeof(float)); }

inline void widen(const c10::BFloat16* x, int64_t d, float* out) {
  const auto* bits = reinterpret_cast<const uint16_t*>(x);
  for (int64_t c = 0; c < d; ++c) {
    const uint32_t w = static_cast<uint32_t>(bits[c]) << 16;
    std::memcpy(out + c, &w, sizeof(float));
  }
}

inline void widen(const c10::Half* x, int64_t d, float* out) {
  int64_t c = 0;
#ifdef __F16C__
  for (; c + 8 <= d; c += 8)
    _mm256_storeu_ps(out + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + c))));
#endif
  for (; c < d; ++c) out[c] = static_cast<float>(x[c]);
}

}  // namespace cache_rows
