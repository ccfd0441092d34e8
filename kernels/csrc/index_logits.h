// MSA's stored block index scored by queries (kernels/index_scores.py defines it; the layout is
// kernels/block_index.py's `pack_index`): for each query head h of KV group h / G and each
// indexed token t of block b,
//
//     logit[h, t] = step_h * scale_t * (qi_h . (u_t - 8)) + q_h . mean_b
//
// with qi_h the head's query rounded to int8 on its own grid (step_h = max |q_h| / 127) and u_t
// the token's D codes (1..15). A block's codes lie by groups of 8 channels, each group's tokens
// side by side, 4 bytes a token: with AVX-512 VNNI, sixteen tokens fill a vector, and for each
// group the low nibbles (channels 8c..8c+3) and the high (8c+4..8c+7) meet the head's 4 int8
// query values broadcast to every lane, in one vpdpbusd each: 2 D / 8 instructions per head and
// sixteen tokens, the nibbles split once for the G heads, no sums across lanes. Elsewhere the same
// integer sums one token at a time. Blocks are shared among PyTorch's threads.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include "kv_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(MSA_AVX512) && defined(MSA_GGML_VNNI)
#include <immintrin.h>
#define MSA_INDEX_VNNI 1
#endif

namespace block_index {

// The index of one layer: codes uint8 [Hkv, cap, D / 2] (whole blocks laid out as above), scales
// fp16 [Hkv, cap], means fp16 [Hkv, cap_blocks, D]; the first n_tokens (whole blocks) indexed.
struct IndexView {
  const uint8_t* codes;
  const c10::Half* scales;
  const c10::Half* means;
  int64_t cap;         // tokens per KV head row of codes and scales
  int64_t cap_blocks;  // blocks per KV head row of means
  int64_t n_tokens;
  int64_t block_size;
};

// The queries as the index's integer products take them: per head, its int8 values packed four
// to an int32 (channels 4w..4w+3), its grid step, and 8 times the sum of its int8 values.
struct QueryCodes {
  std::vector<int32_t> words;
  std::vector<float> step;
  std::vector<int32_t> offset;

  QueryCodes(const float* q, int64_t n_heads, int64_t d)
      : words(static_cast<size_t>(n_heads * d / 4)), step(static_cast<size_t>(n_heads)),
        offset(static_cast<size_t>(n_heads)) {
    std::vector<int8_t> codes(static_cast<size_t>(d));
    for (int64_t h = 0; h < n_heads; ++h) {
      float top = 0.f;
      for (int64_t c = 0; c < d; ++c) top = std::max(top, std::fabs(q[h * d + c]));
      step[h] = top > 0.f ? top / 127.f : 1.f;
      int32_t total = 0;
      for (int64_t c = 0; c < d; ++c) {  // round half to even, as torch.round
        codes[c] = static_cast<int8_t>(std::nearbyint(q[h * d + c] / step[h]));
        total += codes[c];
      }
      offset[h] = 8 * total;
      std::memcpy(words.data() + h * d / 4, codes.data(), static_cast<size_t>(d));
    }
  }

  int8_t value(int64_t h, int64_t d, int64_t c) const {
    return reinterpret_cast<const int8_t*>(words.data() + h * d / 4)[c];
  }
};

// dots[j * bs + t] = qi_h . u_t for the G heads h = kv * G + j and one block's tokens, one at a
// time (any block size).
inline void block_dots_portable(const uint8_t* block, const QueryCodes& qc, int64_t kv, int64_t g, int64_t d,
                                int64_t bs, int32_t* dots) {
  std::fill(dots, dots + g * bs, 0);
  for (int64_t group = 0; group < d / 8; ++group)
    for (int64_t t = 0; t < bs; ++t) {
      const uint8_t* word = block + (group * bs + t) * 4;
      for (int64_t j = 0; j < g; ++j) {
        const int64_t h = kv * g + j;
        int32_t acc = 0;
        for (int64_t k = 0; k < 4; ++k)
          acc += (word[k] & 15) * qc.value(h, d, 8 * group + k) + (word[k] >> 4) * qc.value(h, d, 8 * group + 4 + k);
        dots[j * bs + t] += acc;
      }
    }
}

#ifdef MSA_INDEX_VNNI
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
// Sixteen tokens' sums for HEADS heads from j0, in registers (a fixed count, so the compiler
// keeps each accumulator in a register).
template <int HEADS>
inline void sixteen_tokens(const uint8_t* block, const int32_t* words, int64_t d, int64_t bs, int64_t t0,
                           int32_t* dots) {
  const __m512i nibble = _mm512_set1_epi8(15);
  __m512i acc[HEADS];
  for (int j = 0; j < HEADS; ++j) acc[j] = _mm512_setzero_si512();
  for (int64_t group = 0; group < d / 8; ++group) {
    const __m512i w = _mm512_loadu_si512(block + (group * bs + t0) * 4);
    const __m512i lo = _mm512_and_si512(w, nibble);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble);
    for (int j = 0; j < HEADS; ++j) {
      const int32_t* mine = words + j * d / 4 + 2 * group;
      acc[j] = _mm512_dpbusd_epi32(acc[j], lo, _mm512_set1_epi32(mine[0]));
      acc[j] = _mm512_dpbusd_epi32(acc[j], hi, _mm512_set1_epi32(mine[1]));
    }
  }
  for (int j = 0; j < HEADS; ++j) _mm512_storeu_si512(dots + j * bs + t0, acc[j]);
}

// block_dots_portable for blocks of a multiple of 16 tokens: sixteen tokens a vector, up to
// eight heads at once.
inline void block_dots_vnni(const uint8_t* block, const QueryCodes& qc, int64_t kv, int64_t g, int64_t d,
                            int64_t bs, int32_t* dots) {
  using Run = void (*)(const uint8_t*, const int32_t*, int64_t, int64_t, int64_t, int32_t*);
  static constexpr Run runs[8] = {sixteen_tokens<1>, sixteen_tokens<2>, sixteen_tokens<3>, sixteen_tokens<4>,
                                  sixteen_tokens<5>, sixteen_tokens<6>, sixteen_tokens<7>, sixteen_tokens<8>};
  for (int64_t j0 = 0; j0 < g; j0 += 8) {
    const Run run = runs[std::min<int64_t>(8, g - j0) - 1];
    const int32_t* words = qc.words.data() + (kv * g + j0) * d / 4;
    for (int64_t t0 = 0; t0 < bs; t0 += 16) run(block, words, d, bs, t0, dots + j0 * bs);
  }
}
#pragma GCC pop_options
#endif

// logits [Hq, n_tokens] (row stride `ld`) of the queries q [Hq, D] (fp32, D a multiple of 8)
// against the index.
inline void index_logits(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t d, const IndexView& index,
                         float* logits, int64_t ld) {
  const int64_t g = n_heads / n_kv_heads, bs = index.block_size, n_blocks = index.n_tokens / bs;
  const QueryCodes qc(q, n_heads, d);
  at::parallel_for(0, n_kv_heads * n_blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<int32_t> dots(static_cast<size_t>(g * bs));
    std::vector<float> scale_buf(static_cast<size_t>(bs)), mean_buf(static_cast<size_t>(d));
    for (int64_t job = first; job < last; ++job) {
      const int64_t kv = job / n_blocks, b = job % n_blocks;
      const uint8_t* block = index.codes + (kv * index.cap + b * bs) * (d / 2);
#ifdef MSA_INDEX_VNNI
      if (bs % 16 == 0)
        block_dots_vnni(block, qc, kv, g, d, bs, dots.data());
      else
#endif
        block_dots_portable(block, qc, kv, g, d, bs, dots.data());
      // the block's scales and mean widened once for its G heads (F16C where there is)
      const float* scales = kv_rows::widen(index.scales + kv * index.cap + b * bs, scale_buf.data(), bs);
      const float* mean = kv_rows::widen(index.means + (kv * index.cap_blocks + b) * d, mean_buf.data(), d);
      for (int64_t j = 0; j < g; ++j) {
        const int64_t h = kv * g + j;
        float at_mean = 0.f;
        for (int64_t c = 0; c < d; ++c) at_mean += q[h * d + c] * mean[c];
        const float step = qc.step[h];
        const int32_t offset = qc.offset[h];
        const int32_t* dot = dots.data() + j * bs;
        float* out = logits + h * ld + b * bs;
        for (int64_t t = 0; t < bs; ++t) out[t] = step * scales[t] * static_cast<float>(dot[t] - offset) + at_mean;
      }
    }
  });
}

}  // namespace block_index
