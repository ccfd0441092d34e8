// The block kernels without SIMD intrinsics (CPUs without AVX2): each block unpacked into int8
// values and its groups' scales and mins, then plain loops. See ggml_blocks.h.
#pragma once

#include "ggml_block_types.h"
#include "ggml_input_q8.h"

namespace ggml_blocks {

// One block: q [values], and per group its scale and min (min only for Q4_K; 0 elsewhere):
// d * sc and -(dmin * m), with the integers sc and m kept for the products.
struct Unpacked {
  alignas(64) int8_t q[256];
  float scale[16];
  float min[16];
  int32_t sc[16], m[16];
};

inline void unpack(int64_t type, const uint8_t* b, Unpacked& u) {
  if (type == Q4_K) {  // d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* s = b + 4;
    for (int j = 0; j < 8; ++j) {  // get_scale_min_k4
      const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
      const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      u.scale[j] = d * static_cast<float>(sc);
      u.min[j] = -(dmin * static_cast<float>(m));
      u.sc[j] = sc;
      u.m[j] = m;
    }
    const uint8_t* qs = b + 16;
    for (int j = 0; j < 4; ++j)  // 32 bytes: sub-block 2j in the low nibbles, 2j+1 high
      for (int l = 0; l < 32; ++l) {
        u.q[64 * j + l] = static_cast<int8_t>(qs[32 * j + l] & 0xF);
        u.q[64 * j + 32 + l] = static_cast<int8_t>(qs[32 * j + l] >> 4);
      }
  } else if (type == Q6_K) {  // ql[128], qh[64], int8 scales[16], d
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_at(b + 208);
    for (int g = 0; g < 16; ++g) {
      u.scale[g] = d * static_cast<float>(sc[g]);
      u.min[g] = 0.f;
      u.sc[g] = sc[g];
    }
    for (int n = 0; n < 2; ++n) {
      const uint8_t* l8 = ql + 64 * n;
      const uint8_t* h8 = qh + 32 * n;
      int8_t* q = u.q + 128 * n;
      for (int l = 0; l < 32; ++l) {
        q[l] = static_cast<int8_t>(((l8[l] & 0xF) | (((h8[l] >> 0) & 3) << 4)) - 32);
        q[l + 32] = static_cast<int8_t>(((l8[l + 32] & 0xF) | (((h8[l] >> 2) & 3) << 4)) - 32);
        q[l + 64] = static_cast<int8_t>(((l8[l] >> 4) | (((h8[l] >> 4) & 3) << 4)) - 32);
        q[l + 96] = static_cast<int8_t>(((l8[l + 32] >> 4) | (((h8[l] >> 6) & 3) << 4)) - 32);
      }
    }
  } else if (type == Q5_0) {  // d, 32 high bits, 16 bytes of nibbles
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const uint8_t* qs = b + 6;
    u.scale[0] = half_at(b);
    u.min[0] = 0.f;
    for (int j = 0; j < 16; ++j) {
      u.q[j] = static_cast<int8_t>(((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16);
      u.q[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16);
    }
  } else {  // Q8_0: d, 32 int8
    u.scale[0] = half_at(b);
    u.min[0] = 0.f;
    std::memcpy(u.q, b + 2, 32);
  }
}

// One row (k weights) times the quantized input (ggml_input_q8.h): the same integer sums as
// the SIMD kernels, scaled in fp32 once a block.
inline float row_dot(int64_t type, const uint8_t* row, const InputQ8& x, int64_t k) {
  const int64_t nv = block_values(type), bb = block_bytes(type), g = group_size(type);
  Unpacked u;
  float acc = 0.f;
  for (int64_t blk = 0; blk < k / nv; ++blk) {
    unpack(type, row + blk * bb, u);
    const int8_t* xq = x.q.data() + blk * nv;
    if (type == Q5_0 || type == Q8_0) {
      int32_t s = 0;
      for (int i = 0; i < 32; ++i) s += int32_t{u.q[i]} * int32_t{xq[i]};
      acc += u.scale[0] * x.d[blk] * static_cast<float>(s);
      continue;
    }
    int32_t sum = 0, mins = 0;  // Q4_K, Q6_K: sub-block scales (and Q4_K's mins) in integers
    for (int64_t gi = 0; gi < nv / g; ++gi) {
      int32_t s = 0;
      for (int64_t i = 0; i < g; ++i) s += int32_t{u.q[gi * g + i]} * int32_t{xq[gi * g + i]};
      sum += u.sc[gi] * s;
      if (type == Q4_K) mins += u.m[gi] * (x.sums[blk * 16 + 2 * gi] + x.sums[blk * 16 + 2 * gi + 1]);
    }
    const uint8_t* b = row + blk * bb;
    acc += type == Q4_K ? half_at(b) * x.d[blk] * static_cast<float>(sum) -
                              half_at(b + 2) * x.d[blk] * static_cast<float>(mins)
                        : half_at(b + 208) * x.d[blk] * static_cast<float>(sum);
  }
  return acc;
}

inline void dequantize_block(int64_t type, const uint8_t* b, float* y) {
  Unpacked u;
  unpack(type, b, u);
  const int64_t g = group_size(type);
  for (int64_t i = 0; i < block_values(type); ++i) y[i] = u.scale[i / g] * static_cast<float>(u.q[i]) + u.min[i / g];
}

// One row times an fp32 input, the exact weights (output heads).
inline float row_dot_fp32(int64_t type, const uint8_t* row, const float* x, int64_t k) {
  const int64_t nv = block_values(type), bb = block_bytes(type);
  float w[256], acc = 0.f;
  for (int64_t blk = 0; blk < k / nv; ++blk) {
    dequantize_block(type, row + blk * bb, w);
    for (int64_t i = 0; i < nv; ++i) acc += w[i] * x[blk * nv + i];
  }
  return acc;
}

}  // namespace ggml_blocks
