// MSA's selection by the stored index for one decode token (models/index_selection.py and
// kernels/block_index.py define it): each query head's log-probabilities over the tokens up to
// the token's position, the indexed ones as the index holds their keys (index_logits.h), the rest
// (the last, partial blocks) as stored; a block's score for a KV group is the largest a head of
// the group gives one of its tokens. The group reads its sink and local blocks and, of the blocks
// between them, the `topk` best scored (ties: the lower block) or, with a top-p share, the fewest
// best scored whose estimated share of the group's attention (the mean over its heads) reaches it
// with the forced blocks', at most `topk`. The token reads the union over its KV groups.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "index_logits.h"
#include "kv_rows.h"

namespace block_index {

struct Budget {
  int64_t block_size, topk, local_blocks, sink_blocks;
  double top_p;  // <= 0: a fixed top-k
};

// The blocks a token reads, ascending, and how many of them lie before its local window.
struct Chosen {
  std::vector<int64_t> blocks;
  int64_t n_far = 0;
};

// q [Hq, D] fp32 at its true position `pos` (after RoPE); keys: a layer's key store [Hkv, cap, D]
// (fp32, fp16 or bf16); index: that layer's stored index, covering whole blocks before the
// token's own.
template <typename T>
Chosen select_by_index(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t d, float scale,
                       const IndexView& index, const T* keys, int64_t cap, int64_t pos, const Budget& b) {
  const int64_t n = pos + 1, g = n_heads / n_kv_heads, bs = b.block_size;
  const int64_t own = pos / bs, window_first = std::max<int64_t>(0, own - b.local_blocks + 1);
  const int64_t sink_end = std::min(b.sink_blocks, window_first), n_blocks = own + 1;
  std::vector<float> logp(static_cast<size_t>(n_heads * n));
  if (index.n_tokens > 0) index_logits(q, n_heads, n_kv_heads, d, index, logp.data(), n);
  std::vector<float> buf(static_cast<size_t>(d));
  for (int64_t kv = 0; kv < n_kv_heads; ++kv)
    for (int64_t t = index.n_tokens; t < n; ++t) {  // the unindexed tail, as stored
      const float* k = kv_rows::widen(keys + (kv * cap + t) * d, buf.data(), d);
      for (int64_t h = kv * g; h < (kv + 1) * g; ++h) {
        float acc = 0.f;
        for (int64_t c = 0; c < d; ++c) acc += q[h * d + c] * k[c];
        logp[h * n + t] = acc;
      }
    }
  for (int64_t h = 0; h < n_heads; ++h) {  // log-softmax of the scaled logits
    float* row = logp.data() + h * n;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < n; ++t) top = std::max(top, row[t] *= scale);
    double sum = 0.0;
    for (int64_t t = 0; t < n; ++t) sum += std::exp(row[t] - top);
    const float lse = top + static_cast<float>(std::log(sum));
    for (int64_t t = 0; t < n; ++t) row[t] -= lse;
  }
  std::vector<char> read(static_cast<size_t>(n_blocks), 0);
  for (int64_t blk = 0; blk < sink_end; ++blk) read[blk] = 1;
  for (int64_t blk = window_first; blk <= own; ++blk) read[blk] = 1;
  std::vector<float> score(static_cast<size_t>(n_blocks)), mass(static_cast<size_t>(n_blocks));
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(0, window_first - sink_end)));
  for (int64_t kv = 0; kv < n_kv_heads; ++kv) {
    std::fill(score.begin(), score.end(), -std::numeric_limits<float>::infinity());
    std::fill(mass.begin(), mass.end(), 0.f);
    for (int64_t h = kv * g; h < (kv + 1) * g; ++h) {
      const float* row = logp.data() + h * n;
      for (int64_t t = 0; t < n; ++t) {
        score[t / bs] = std::max(score[t / bs], row[t]);
        if (b.top_p > 0) mass[t / bs] += std::exp(row[t]) / static_cast<float>(g);
      }
    }
    std::iota(order.begin(), order.end(), sink_end);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return score[a] > score[c]; });
    float held = 0.f;  // the forced blocks' share, then the kept candidates' added
    for (int64_t blk = 0; blk < n_blocks; ++blk)
      if (blk < sink_end || blk >= window_first) held += mass[blk];
    int64_t kept = 0;
    for (int64_t blk : order) {
      if (kept == b.topk || !std::isfinite(score[blk]) || (b.top_p > 0 && held >= b.top_p)) break;
      read[blk] = 1;
      held += mass[blk];
      ++kept;
    }
  }
  Chosen out;
  for (int64_t blk = 0; blk < n_blocks; ++blk)
    if (read[blk]) {
      out.blocks.push_back(blk);
      if (blk < window_first) ++out.n_far;
    }
  return out;
}

}  // namespace block_index
