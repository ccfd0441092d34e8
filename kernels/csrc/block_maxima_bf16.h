// The screen of a question's scan (msa.kernels.peaks) in one pass over a chunk of keys, on CPUs
// with AVX-512 BF16: for each query and each block of keys, the largest product of the bf16
// query with the bf16-rounded key less `center`, summed in fp32 (vdpbf16ps), never writing the
// products out; and, from the same reading of the fp32 keys, each block's mean key less center
// and each channel's largest |key - center| in the block. msa.kernels.block_maxima's
// `block_maxima_reference` is the definition in plain PyTorch this kernel is tested against.
// Included by question_scan.cpp, after torch/extension.h.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#ifdef MSA_AVX512_BF16
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include "attention_bf16_keys.h"
#endif

namespace question_scan {

#ifdef MSA_AVX512_BF16

using attention_bf16::bf16_bits;
using attention_bf16::kLanes;
constexpr int64_t kRowGroup = 4;  // query rows whose products are summed in registers at once
constexpr int kTileGroup = 4;      // tiles of 16 keys read at once for those rows

inline __m512bh as_bf16(__m512i x) { return (__m512bh)x; }

// One block of B keys (fp32 rows of d channels at `keys`): packed as bf16 pairs for vdpbf16ps
// ([B / 16][d / 2][16]: for 16 keys, channel pair p of each in lane order), with its mean
// key less c and each channel's largest |key - c| written to mean[d] and reach[d].
inline void pack_block(const float* keys, int64_t row_stride, int64_t block_size, int64_t d, const float* c,
                       uint32_t* packed, float* mean, float* reach) {
  const int64_t pairs = d / 2;
  alignas(64) uint16_t bits[512];
  for (int64_t ch = 0; ch < d; ch += kLanes) {
    _mm512_storeu_ps(mean + ch, _mm512_setzero_ps());
    _mm512_storeu_ps(reach + ch, _mm512_setzero_ps());
  }
  for (int64_t j = 0; j < block_size; ++j) {
    const float* key = keys + j * row_stride;
    for (int64_t ch = 0; ch < d; ch += kLanes) {
      const __m512 moved = _mm512_sub_ps(_mm512_loadu_ps(key + ch), _mm512_loadu_ps(c + ch));
      _mm512_storeu_ps(mean + ch, _mm512_add_ps(_mm512_loadu_ps(mean + ch), moved));
      _mm512_storeu_ps(reach + ch, _mm512_max_ps(_mm512_loadu_ps(reach + ch), _mm512_abs_ps(moved)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(bits + ch), bf16_bits(moved));
    }
    const uint32_t* key_pairs = reinterpret_cast<const uint32_t*>(bits);
    const int64_t tile = j / kLanes, lane = j % kLanes;
    for (int64_t p = 0; p < pairs; ++p) packed[(tile * pairs + p) * kLanes + lane] = key_pairs[p];
  }
  const __m512 inv = _mm512_set1_ps(1.f / static_cast<float>(block_size));
  for (int64_t ch = 0; ch < d; ch += kLanes) _mm512_storeu_ps(mean + ch, _mm512_mul_ps(_mm512_loadu_ps(mean + ch), inv));
}

// best[r] = max(best[r], the products of query row r (bf16 pairs q [kRowGroup][pairs]) with NT
// tiles of packed keys), lane by lane, for kRowGroup rows; NT known when compiled, so that the
// kRowGroup * NT sums stay in registers.
template <int NT>
inline void rows_tiles_max(const uint32_t* q, int64_t pairs, const uint32_t* tiles, __m512* best) {
  __m512 s[kRowGroup][NT];
  for (int64_t r = 0; r < kRowGroup; ++r)
    for (int t = 0; t < NT; ++t) s[r][t] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh k[NT];
    for (int t = 0; t < NT; ++t) k[t] = as_bf16(_mm512_loadu_si512(tiles + (t * pairs + p) * kLanes));
    for (int64_t r = 0; r < kRowGroup; ++r) {
      const __m512bh qr = as_bf16(_mm512_set1_epi32(static_cast<int>(q[r * pairs + p])));
      for (int t = 0; t < NT; ++t) s[r][t] = _mm512_dpbf16_ps(s[r][t], qr, k[t]);
    }
  }
  for (int64_t r = 0; r < kRowGroup; ++r)
    for (int t = 0; t < NT; ++t) best[r] = _mm512_max_ps(best[r], s[r][t]);
}

// The largest product of each of kRowGroup query rows (bf16 pairs q [kRowGroup][pairs]) with
// the block's `tiles` tiles of packed keys, into top[kRowGroup].
inline void rows_block_max(const uint32_t* q, int64_t pairs, const uint32_t* packed, int64_t tiles, float* top) {
  __m512 best[kRowGroup];
  for (int64_t r = 0; r < kRowGroup; ++r) best[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t t0 = 0;
  for (; t0 + kTileGroup <= tiles; t0 += kTileGroup) rows_tiles_max<kTileGroup>(q, pairs, packed + t0 * pairs * kLanes, best);
  switch (tiles - t0) {
    case 3: rows_tiles_max<3>(q, pairs, packed + t0 * pairs * kLanes, best); break;
    case 2: rows_tiles_max<2>(q, pairs, packed + t0 * pairs * kLanes, best); break;
    case 1: rows_tiles_max<1>(q, pairs, packed + t0 * pairs * kLanes, best); break;
    default: break;
  }
  for (int64_t r = 0; r < kRowGroup; ++r) top[r] = _mm512_reduce_max_ps(best[r]);
}

#endif  // MSA_AVX512_BF16

inline bool built_with_bf16() {
#ifdef MSA_AVX512_BF16
  return true;
#else
  return false;
#endif
}

// q bf16 [Hkv, M, D] contiguous; keys fp32 [Hkv, n, D], rows contiguous (n a multiple of
// block_size, itself a multiple of 16; D a multiple of 16, at most 512); center fp32 [Hkv, D]
// contiguous. Returns (maxima fp32 [Hkv, n / B, M], means fp32 [Hkv, n / B, D], reach fp32
// [Hkv, n / B, D]).
inline std::vector<at::Tensor> block_maxima(at::Tensor q, at::Tensor keys, at::Tensor center, int64_t block_size) {
  TORCH_CHECK(built_with_bf16(), "built without AVX-512 BF16");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.dim() == 3 && q.is_contiguous(), "q: contiguous bf16 [Hkv, M, D]");
  const int64_t hkv = q.size(0), m = q.size(1), d = q.size(2);
  TORCH_CHECK(d % 16 == 0 && d <= 512, "head_dim must be a multiple of 16, at most 512");
  TORCH_CHECK(keys.scalar_type() == at::kFloat && keys.dim() == 3 && keys.size(0) == hkv && keys.size(2) == d &&
                  keys.stride(2) == 1 && keys.stride(1) == d,
              "keys: fp32 [Hkv, n, D] as q, rows contiguous");
  TORCH_CHECK(center.scalar_type() == at::kFloat && center.is_contiguous() && center.dim() == 2 &&
                  center.size(0) == hkv && center.size(1) == d,
              "center: contiguous fp32 [Hkv, D]");
  TORCH_CHECK(block_size >= 16 && block_size % 16 == 0 && keys.size(1) % block_size == 0,
              "block_size: a multiple of 16 that divides the keys");
  const int64_t n_blocks = keys.size(1) / block_size;
  at::Tensor maxima = at::empty({hkv, n_blocks, m}, at::kFloat);
  at::Tensor means = at::empty({hkv, n_blocks, d}, at::kFloat);
  at::Tensor reach = at::empty({hkv, n_blocks, d}, at::kFloat);
#ifdef MSA_AVX512_BF16
  const int64_t pairs = d / 2, tiles = block_size / kLanes;
  const int64_t padded = (m + kRowGroup - 1) / kRowGroup * kRowGroup;
  std::vector<uint32_t> rows(hkv * padded * pairs, 0);  // padding rows: zeros, never written out
  const auto* qd = reinterpret_cast<const uint32_t*>(q.data_ptr<at::BFloat16>());
  for (int64_t h = 0; h < hkv; ++h) std::copy(qd + h * m * pairs, qd + (h + 1) * m * pairs, rows.begin() + h * padded * pairs);
  const float* kd = keys.data_ptr<float>();
  const float* cd = center.data_ptr<float>();
  float* out = maxima.data_ptr<float>();
  float* mean_out = means.data_ptr<float>();
  float* reach_out = reach.data_ptr<float>();
  const int64_t key_stride = keys.stride(0);
  at::parallel_for(0, hkv * n_blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<uint32_t> packed(block_size * pairs);
    float top[kRowGroup];
    for (int64_t task = first; task < last; ++task) {
      const int64_t h = task / n_blocks, b = task % n_blocks;
      pack_block(kd + h * key_stride + b * block_size * d, d, block_size, d, cd + h * d, packed.data(),
                 mean_out + task * d, reach_out + task * d);
      const uint32_t* qh = rows.data() + h * padded * pairs;
      float* row_out = out + task * m;
      for (int64_t r0 = 0; r0 < m; r0 += kRowGroup) {
        rows_block_max(qh + r0 * pairs, pairs, packed.data(), tiles, top);
        for (int64_t r = 0; r < std::min(kRowGroup, m - r0); ++r) row_out[r0 + r] = top[r];
      }
    }
  });
#endif
  return {maxima, means, reach};
}

}  // namespace question_scan

#ifdef MSA_AVX512_BF16
#pragma GCC pop_options
#endif
