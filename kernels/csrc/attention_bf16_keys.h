// Keys and values laid out for attention_bf16.cpp's vdpbf16ps loops, from two sources:
// - pack_keys: one batch's bf16 keys and values as the caller rounded them, with positions;
// - pack_selected_blocks: the blocks an MSA query block selected, read straight from the K/V
//   cache (fp32, fp16 or bf16 rows) without a gathered fp32 copy: each far block's keys rotated
//   by its own angle (RoPE's rotate-half, the first R channels) where the caller moves far blocks
//   to bounded distances, the keys less their mean (the keys any row may see), then rounded to
//   bf16 (to nearest, ties to even, as PyTorch's .to(torch.bfloat16)).
// msa.kernels.attention_bf16's `attention_bf16_blocks_reference` is the definition.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "widen_row.h"

namespace attention_bf16 {

constexpr int64_t kLanes = 16;  // fp32 lanes of a zmm register: keys (scores) or channels (output)
constexpr int64_t kBlock = 64;  // keys per softmax step

// One batch's keys and values in the layouts vdpbf16ps reads, padded with zeros to whole blocks:
// k [blocks * 4][D / 2][16]: for 16 keys, the channel pair p of each key in lane order;
// v [blocks * 32][D]: for the key pair (2i, 2i+1), each channel's two values.
struct PackedKeys {
  std::vector<uint32_t> k, v;
  std::vector<int32_t> pos;        // [blocks * 64], -1 for padding
  std::vector<int64_t> lo, hi;     // per block: the smallest and largest position of a key
  std::vector<uint8_t> all_valid;  // per block: no padding (position < 0)
};

inline void reset(PackedKeys& out, int64_t n_keys, int64_t d) {
  const int64_t n_blocks = (n_keys + kBlock - 1) / kBlock, padded = n_blocks * kBlock;
  out.k.assign(padded * (d / 2), 0);
  out.v.assign(padded / 2 * d, 0);
  out.pos.assign(padded, -1);
  out.lo.assign(n_blocks, std::numeric_limits<int64_t>::max());
  out.hi.assign(n_blocks, -1);
  out.all_valid.assign(n_blocks, 0);
}

// Key j's bf16 channels (d / 2 pairs as 32-bit words) and value j's bf16 channels.
inline void put_key(PackedKeys& out, int64_t j, const uint32_t* pairs_of_key, int64_t d) {
  const int64_t pairs = d / 2, tile = j / kLanes, lane = j % kLanes;
  for (int64_t p = 0; p < pairs; ++p) out.k[(tile * pairs + p) * kLanes + lane] = pairs_of_key[p];
}
inline void put_value(PackedKeys& out, int64_t j, const uint16_t* value, int64_t d) {
  uint16_t* vp = reinterpret_cast<uint16_t*>(out.v.data() + (j / 2) * d);
  for (int64_t c = 0; c < d; ++c) vp[2 * c + (j % 2)] = value[c];
}

// Each block's lowest and highest key position and whether it has no padding, from out.pos.
inline void summarize_positions(PackedKeys& out) {
  for (size_t b = 0; b < out.lo.size(); ++b) {
    bool valid = true;
    for (size_t j = b * kBlock; j < (b + 1) * kBlock; ++j) {
      const int64_t p = out.pos[j];
      if (p < 0) {
        valid = false;
        continue;
      }
      out.lo[b] = std::min(out.lo[b], p);
      out.hi[b] = std::max(out.hi[b], p);
    }
    out.all_valid[b] = valid;
  }
}

inline void pack_keys(const uint16_t* k, const uint16_t* v, const int64_t* k_pos, int64_t n_keys, int64_t d,
                      PackedKeys& out) {
  reset(out, n_keys, d);
  for (int64_t j = 0; j < n_keys; ++j) {
    put_key(out, j, reinterpret_cast<const uint32_t*>(k + j * d), d);
    put_value(out, j, v + j * d, d);
    out.pos[j] = static_cast<int32_t>(std::max<int64_t>(k_pos[j], -1));
  }
  summarize_positions(out);
}

// 16 fp32 lanes rounded to bf16 bits, to nearest with ties to even; a NaN stays a quiet NaN.
inline __m256i bf16_bits(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), odd), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}

// x [d] rotated in place by cos, sin [r] (r <= d, even): channel i < r/2 pairs with i + r/2, as
// RoPE's rotate-half computes x * cos + cat(-x2, x1) * sin; channels from r on pass through.
inline void rotate(float* x, const float* cos, const float* sin, int64_t r) {
  const int64_t half = r / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

// The selected blocks of one (KV head, query block) batch: block ids idx [n_slots] (-1: unused)
// of `block_size` tokens over the cache rows k, v (row t at k + t * row_stride, `n_tokens` rows;
// a position past them is padding); with cos, sin (each [n_slots, r], or null) slot s's keys
// rotated by its angles. Keys less the mean of the visible keys, rounded to bf16.
template <typename T>
void pack_selected_blocks(const T* k, const T* v, int64_t row_stride, int64_t n_tokens, const int32_t* idx,
                          int64_t n_slots, int64_t block_size, const float* cos, const float* sin, int64_t r,
                          int64_t d, std::vector<float>& scratch, PackedKeys& out) {
  const int64_t n_keys = n_slots * block_size;
  reset(out, n_keys, d);
  scratch.assign(static_cast<size_t>(n_keys * d), 0.f);
  std::vector<float> mean(static_cast<size_t>(d), 0.f);
  int64_t visible = 0;
  for (int64_t s = 0; s < n_slots; ++s) {
    if (idx[s] < 0) continue;
    for (int64_t t = 0; t < block_size; ++t) {
      const int64_t j = s * block_size + t, position = static_cast<int64_t>(idx[s]) * block_size + t;
      if (position >= n_tokens) break;
      float* key = scratch.data() + j * d;
      cache_rows::widen(k + position * row_stride, d, key);
      if (cos != nullptr) rotate(key, cos + s * r, sin + s * r, r);
      for (int64_t c = 0; c < d; ++c) mean[c] += key[c];
      out.pos[j] = static_cast<int32_t>(position);
      ++visible;
    }
  }
  if (visible > 0)
    for (int64_t c = 0; c < d; ++c) mean[c] /= static_cast<float>(visible);
  alignas(64) uint16_t bits[512];
  std::vector<float> value(static_cast<size_t>(d));
  for (int64_t j = 0; j < n_keys; ++j) {
    if (out.pos[j] < 0) continue;  // padding stays zeros: never read (masked by its position)
    const float* key = scratch.data() + j * d;
    for (int64_t c = 0; c < d; c += kLanes) {
      const __m512 centered = _mm512_sub_ps(_mm512_loadu_ps(key + c), _mm512_loadu_ps(mean.data() + c));
      _mm256_store_si256(reinterpret_cast<__m256i*>(bits + c), bf16_bits(centered));
    }
    put_key(out, j, reinterpret_cast<const uint32_t*>(bits), d);
    cache_rows::widen(v + static_cast<int64_t>(out.pos[j]) * row_stride, d, value.data());
    for (int64_t c = 0; c < d; c += kLanes)
      _mm256_store_si256(reinterpret_cast<__m256i*>(bits + c), bf16_bits(_mm512_loadu_ps(value.data() + c)));
    put_value(out, j, bits, d);
  }
  summarize_positions(out);
}

}  // namespace attention_bf16
