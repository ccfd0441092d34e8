// 2^x on 16 fp32 lanes for AVX-512 code (attention_bf16.cpp, exact_peaks.h); include it inside
// a region compiled for AVX-512 F.
#pragma once

#include <immintrin.h>

// 2^x for lanes x <= 0: x = n + f with |f| <= 1/2, 2^f = e^(f ln2) by its Taylor polynomial to
// degree 6 (relative error < 2e-7), times 2^n; x below -126 gives 2^-126.
inline __m512 exp2_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(x, n), _mm512_set1_ps(0.69314718056f));
  __m512 e = _mm512_set1_ps(1.f / 720.f);
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.f / 120.f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.f / 24.f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.f / 6.f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(0.5f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(e, n);
}
