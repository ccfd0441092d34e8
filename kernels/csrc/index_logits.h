// MSA's stored block index scored by queries (kernels/block_index.py, `pack_index`): for each
// query head h of KV group h / G and each indexed token t of block b,
//
//     logit[h, t] = q_h . (scale_t * (code_t - 8) + mean_b)
//                 = scale_t * (q_h . code_t - 8 * sum(q_h)) + q_h . mean_b
//
// with code_t the token's D 4-bit codes (channel 2i in the low nibble of byte i, 2i + 1 in the
// high one). Each token's codes are read once for the G heads of its group; the query is split
// into its even and odd channels, so the low nibbles meet the even channels and the high the
// odd ones without reordering bytes. Blocks are shared among PyTorch's threads.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <vector>

namespace block_index {

// The index of one layer: codes uint8 [Hkv, cap, D / 2], scales fp16 [Hkv, cap], means fp16
// [Hkv, cap / B, D] (rows of `cap` tokens per KV head; the first n_tokens indexed).
struct IndexView {
  const uint8_t* codes;
  const c10::Half* scales;
  const c10::Half* means;
  int64_t cap;       // tokens per KV head row of codes and scales
  int64_t cap_blocks;  // blocks per KV head row of means
  int64_t n_tokens;  // indexed tokens: a multiple of block_size
  int64_t block_size;
};

// logits [Hq, n_tokens] (row stride `ld`) of the queries q [Hq, D] (fp32) against the index.
inline void index_logits(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t d,
                         const IndexView& index, float* logits, int64_t ld) {
  const int64_t g = n_heads / n_kv_heads, half = d / 2, bs = index.block_size;
  // per head: its even channels, its odd channels, and 8 times its sum (the codes' offset)
  std::vector<float> split(static_cast<size_t>(n_heads * d)), offset(static_cast<size_t>(n_heads));
  for (int64_t h = 0; h < n_heads; ++h) {
    float total = 0.f;
    for (int64_t i = 0; i < half; ++i) {
      split[h * d + i] = q[h * d + 2 * i];
      split[h * d + half + i] = q[h * d + 2 * i + 1];
      total += q[h * d + 2 * i] + q[h * d + 2 * i + 1];
    }
    offset[h] = 8.f * total;
  }
  const int64_t n_blocks = index.n_tokens / bs;
  at::parallel_for(0, n_kv_heads * n_blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> lo(static_cast<size_t>(half)), hi(static_cast<size_t>(half));
    std::vector<float> at_mean(static_cast<size_t>(g));
    for (int64_t job = first; job < last; ++job) {
      const int64_t kv = job / n_blocks, b = job % n_blocks;
      const c10::Half* mean = index.means + (kv * index.cap_blocks + b) * d;
      for (int64_t j = 0; j < g; ++j) {
        const float* qh = q + (kv * g + j) * d;
        float m = 0.f;
#pragma omp simd reduction(+ : m)
        for (int64_t c = 0; c < d; ++c) m += qh[c] * static_cast<float>(mean[c]);
        at_mean[j] = m;
      }
      for (int64_t t = b * bs; t < (b + 1) * bs; ++t) {
        const uint8_t* codes = index.codes + (kv * index.cap + t) * half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          lo[i] = static_cast<float>(codes[i] & 15);
          hi[i] = static_cast<float>(codes[i] >> 4);
        }
        const float scale = static_cast<float>(index.scales[kv * index.cap + t]);
        for (int64_t j = 0; j < g; ++j) {
          const int64_t h = kv * g + j;
          const float* even = split.data() + h * d;
          const float* odd = even + half;
          float acc = 0.f;
#pragma omp simd reduction(+ : acc)
          for (int64_t i = 0; i < half; ++i) acc += even[i] * lo[i] + odd[i] * hi[i];
          logits[h * ld + t] = scale * (acc - offset[h]) + at_mean[j];
        }
      }
    }
  });
}

}  // namespace block_index
