// MSA's selection by the stored index for one decode token (models/index_selection.py and
// kernels/block_index.py define it): each query head's log-probabilities over the tokens up to
// the token's position, the indexed ones as the index holds their keys (index_logits.h), the rest
// (the last, partial blocks) as stored; a block's score for a KV group is the largest a head of
// the group gives one of its tokens. The group reads its sink and local blocks and, of the blocks
// between them, the `topk` best scored (ties: the lower block) or, with a top-p share, the fewest
// best scored whose estimated share of the group's attention (the mean over its heads) reaches it
// with the forced blocks', at most `topk`: each KV head reads its own group's blocks.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "index_logits.h"
#include "kv_rows.h"

namespace block_index {

// One head's row [n] of logits before their scale (> 0) pooled per block of bs: each block's
// largest scaled logit, and its sum of exp(scaled logit - top) with top the row's largest scaled
// logit; returns (top, the row's sum).
inline std::pair<float, float> pool_row_portable(const float* row, int64_t n, int64_t bs, float scale,
                                                 float* block_max, float* block_sum) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < n; ++t) top = std::max(top, row[t]);
  top *= scale;
  float total = 0.f;
  for (int64_t b0 = 0; b0 < n; b0 += bs) {
    float m = -std::numeric_limits<float>::infinity(), sum = 0.f;
    for (int64_t t = b0; t < std::min(n, b0 + bs); ++t) {
      m = std::max(m, row[t]);
      sum += std::exp(row[t] * scale - top);
    }
    block_max[b0 / bs] = m * scale;
    block_sum[b0 / bs] = sum;
    total += sum;
  }
  return {top, total};
}

#ifdef MSA_INDEX_VNNI
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include "avx512_exp2.h"
// pool_row_portable on sixteen lanes (blocks of a multiple of 16 tokens), the exponentials by
// avx512_exp2.h's polynomial.
inline std::pair<float, float> pool_row_avx512(const float* row, int64_t n, int64_t bs, float scale,
                                               float* block_max, float* block_sum) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 top_v = neg_inf;
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 m = n - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - t)) - 1);
    top_v = _mm512_mask_max_ps(top_v, m, top_v, _mm512_maskz_loadu_ps(m, row + t));
  }
  const float top = _mm512_reduce_max_ps(top_v) * scale;
  // exp(x * scale - top) = 2^((x * scale - top) * log2(e))
  const __m512 mul = _mm512_set1_ps(scale * 1.44269504089f), shift = _mm512_set1_ps(top * 1.44269504089f);
  float total = 0.f;
  for (int64_t b0 = 0; b0 < n; b0 += bs) {
    __m512 m_v = neg_inf, sum_v = _mm512_setzero_ps();
    for (int64_t t = b0; t < std::min(n, b0 + bs); t += 16) {
      const __mmask16 m = n - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - t)) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(m, row + t);
      m_v = _mm512_mask_max_ps(m_v, m, m_v, x);
      const __m512 e = exp2_nonpositive(_mm512_min_ps(_mm512_fmsub_ps(x, mul, shift), _mm512_setzero_ps()));
      sum_v = _mm512_mask_add_ps(sum_v, m, sum_v, e);
    }
    block_max[b0 / bs] = _mm512_reduce_max_ps(m_v) * scale;
    block_sum[b0 / bs] = _mm512_reduce_add_ps(sum_v);
    total += block_sum[b0 / bs];
  }
  return {top, total};
}
#pragma GCC pop_options
#endif

inline std::pair<float, float> pool_row(const float* row, int64_t n, int64_t bs, float scale, float* block_max,
                                        float* block_sum) {
#ifdef MSA_INDEX_VNNI
  if (bs % 16 == 0) return pool_row_avx512(row, n, bs, scale, block_max, block_sum);
#endif
  return pool_row_portable(row, n, bs, scale, block_max, block_sum);
}

struct Budget {
  int64_t block_size, topk, local_blocks, sink_blocks;
  double top_p;  // <= 0: a fixed top-k
};

// The blocks a KV head reads, ascending, and how many of them lie before its local window.
struct Chosen {
  std::vector<int64_t> blocks;
  int64_t n_far = 0;
};

// One Chosen per KV head. q [Hq, D] fp32 at its true position `pos` (after RoPE); keys: a layer's
// key store [Hkv, cap, D] (fp32, fp16 or bf16); index: that layer's stored index, covering whole
// blocks before the token's own.
template <typename T>
std::vector<Chosen> select_by_index(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t d, float scale,
                                    const IndexView& index, const T* keys, int64_t cap, int64_t pos,
                                    const Budget& b) {
  const int64_t n = pos + 1, g = n_heads / n_kv_heads, bs = b.block_size;
  const int64_t own = pos / bs, window_first = std::max<int64_t>(0, own - b.local_blocks + 1);
  const int64_t sink_end = std::min(b.sink_blocks, window_first), n_blocks = own + 1;
  std::vector<float> logits(static_cast<size_t>(n_heads * n));
  if (index.n_tokens > 0) index_logits(q, n_heads, n_kv_heads, d, index, logits.data(), n);
  std::vector<float> buf(static_cast<size_t>(d));
  for (int64_t kv = 0; kv < n_kv_heads; ++kv)
    for (int64_t t = index.n_tokens; t < n; ++t) {  // the unindexed tail, as stored
      const float* k = kv_rows::widen(keys + (kv * cap + t) * d, buf.data(), d);
      for (int64_t h = kv * g; h < (kv + 1) * g; ++h) {
        float acc = 0.f;
        for (int64_t c = 0; c < d; ++c) acc += q[h * d + c] * k[c];
        logits[h * n + t] = acc;
      }
    }
  // per head and block: the largest log-probability of a token there, and the block's share
  std::vector<float> head_max(static_cast<size_t>(n_heads * n_blocks)), head_mass(head_max.size());
  at::parallel_for(0, n_heads, 1, [&](int64_t first, int64_t last) {
    for (int64_t h = first; h < last; ++h) {
      float* bmax = head_max.data() + h * n_blocks;
      float* bsum = head_mass.data() + h * n_blocks;
      const auto [top, total] = pool_row(logits.data() + h * n, n, bs, scale, bmax, bsum);
      const float lse = top + std::log(total);
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        bmax[blk] -= lse;
        bsum[blk] /= total;
      }
    }
  });
  std::vector<float> score(static_cast<size_t>(n_blocks)), mass(static_cast<size_t>(n_blocks));
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(0, window_first - sink_end)));
  std::vector<Chosen> out(static_cast<size_t>(n_kv_heads));
  for (int64_t kv = 0; kv < n_kv_heads; ++kv) {
    std::fill(score.begin(), score.end(), -std::numeric_limits<float>::infinity());
    std::fill(mass.begin(), mass.end(), 0.f);
    for (int64_t h = kv * g; h < (kv + 1) * g; ++h)
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        score[blk] = std::max(score[blk], head_max[h * n_blocks + blk]);
        mass[blk] += head_mass[h * n_blocks + blk] / static_cast<float>(g);
      }
    std::iota(order.begin(), order.end(), sink_end);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return score[a] > score[c]; });
    float held = 0.f;  // the forced blocks' share, then the kept candidates' added
    for (int64_t blk = 0; blk < n_blocks; ++blk)
      if (blk < sink_end || blk >= window_first) held += mass[blk];
    std::vector<int64_t>& blocks = out[kv].blocks;
    for (int64_t blk = 0; blk < sink_end; ++blk) blocks.push_back(blk);
    for (int64_t blk : order) {
      if (static_cast<int64_t>(blocks.size()) - sink_end == b.topk || !std::isfinite(score[blk]) ||
          (b.top_p > 0 && held >= b.top_p))
        break;
      blocks.push_back(blk);
      held += mass[blk];
    }
    std::sort(blocks.begin(), blocks.end());
    out[kv].n_far = static_cast<int64_t>(blocks.size());
    for (int64_t blk = window_first; blk <= own; ++blk) blocks.push_back(blk);
  }
  return out;
}

}  // namespace block_index
