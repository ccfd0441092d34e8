// Decode's matvec rows for Q4_K, Q6_K, Q5_0 and Q8_0 on 512-bit vectors with AVX-512 VNNI
// (included by ggml_blocks_avx2.h where the build defines MSA_AVX512 and MSA_GGML_VNNI).
//
// Why: on 2 cores the 256-bit rows (ggml_blocks_avx2.h) are bound by their instructions, not
// by memory: a Llama-3.1-8B-shape Q4_K_M step read its weights at ~31 GB/s against a 45 GB/s
// read peak. Here each instruction unpacks, multiplies or scales 64 values instead of 32, and
// VNNI's vpdpwssd multiplies the int16 pair sums by their sub-block scales and adds them in one.
//
// The integers are the 256-bit kernels' (the same q times the same input q, the same sub-block
// scales, exact). Q4_K and Q6_K sum them in fp32 over 16 lanes instead of 8 (another order of
// the same sums); Q5_0 and Q8_0 keep the 256-bit kernel's fp32 steps (the same bits).
#pragma once

#include "ggml_block_types.h"
#include "ggml_input_q8.h"

namespace ggml_blocks {

// int16 lane i of a product of 64 values (maddubs: values 2i and 2i+1) reads scale
// `first + i / per`: the permutation that spreads 8 or 16 int16 scales over such a product.
struct ScaleLanes {
  alignas(64) int16_t idx[4][32];
  constexpr ScaleLanes(int step, int per) : idx{} {
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 32; ++i) idx[j][i] = static_cast<int16_t>(step * j + i / per);
  }
  __m512i operator[](int j) const { return _mm512_load_si512(idx[j]); }
};
inline constexpr ScaleLanes q4k_lanes{2, 16};  // sub-blocks 2j and 2j + 1 of 32 values
inline constexpr ScaleLanes q6k_lanes{4, 8};   // groups 4j .. 4j + 3 of 16 values

inline __m512i load64(const int8_t* p) { return _mm512_loadu_si512(p); }

// 32 bytes in both halves of a 512-bit vector, each 16-bit lane shifted right by its count in
// `shift` (0 in the lower half, the upper half's own count above).
GGML_INLINE __m512i both_halves(const uint8_t* p, __m512i shift) {
  return _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), shift);
}

GGML_INLINE float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

// Q4_K (144-byte blocks of 256): per 64 values j, the 32 bytes of sub-blocks 2j (low nibbles)
// and 2j+1 (high nibbles) side by side, in the input's order; their two scales on the int16
// pair sums. The mins times the input's sums as in the 256-bit kernel.
inline float row_dot_q4k_512(const uint8_t* row, const InputQ8& x, int64_t k) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m512i pick[4] = {q4k_lanes[0], q4k_lanes[1], q4k_lanes[2], q4k_lanes[3]};
  const int8_t* xq = x.q.data();
  __m512 acc = _mm512_setzero_ps();
  __m128 mins = _mm_setzero_ps();
  for (int64_t blk = 0; blk < k / 256; ++blk) {
    const uint8_t* b = row + blk * 144;
    prefetch_ahead(b, 144);
    const int8_t* xb = xq + blk * 256;
    const __m128i bytes = q4k_scales_mins(b);
    mins = q4k_add_mins(b, bytes, x, blk, mins);
    const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(bytes));
    __m512i sum = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      const __m512i q = _mm512_and_si512(both_halves(b + 16 + 32 * j, shift), m4);
      const __m512i p = _mm512_maddubs_epi16(q, load64(xb + 64 * j));
      sum = _mm512_dpwssd_epi32(sum, p, _mm512_permutexvar_epi16(pick[j], scales));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(half_at(b) * x.d[blk]), _mm512_cvtepi32_ps(sum), acc);
  }
  mins = _mm_add_ps(mins, _mm_movehl_ps(mins, mins));
  mins = _mm_add_ss(mins, _mm_movehdup_ps(mins));
  return hsum512(acc) - _mm_cvtss_f32(mins);
}

// Q6_K (210-byte blocks of 256): per 128 values n, the 64 low-nibble bytes hold values 0..63
// (low nibbles) and 64..127 (high nibbles); their 2 high bits come from 32 bytes, shifted by
// 0 and 2 (values 0..63) and by 4 and 6 (64..127). Stored as q + 32: minus 32 times the
// input's sums, as in the 256-bit kernel.
inline float row_dot_q6k_512(const uint8_t* row, const InputQ8& x, int64_t k) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m_high = _mm512_set1_epi8(0x30);
  const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  const __m512i pick[4] = {q6k_lanes[0], q6k_lanes[1], q6k_lanes[2], q6k_lanes[3]};
  const int8_t* xq = x.q.data();
  __m512 acc = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < k / 256; ++blk) {
    const uint8_t* b = row + blk * 210;
    prefetch_ahead(b, 210);
    const int8_t* xb = xq + blk * 256;
    const __m128i scales8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    const __m256i sums16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums.data() + blk * 16));
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(scales8), sums16), 5);
    __m512i sum = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(offset));
    const __m512i scales = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(scales8));
    for (int n = 0; n < 2; ++n) {
      const __m512i low = load64(reinterpret_cast<const int8_t*>(b + 64 * n));
      const __m512i high = both_halves(b + 128 + 32 * n, shift);
      const __m512i first = _mm512_or_si512(_mm512_and_si512(low, m4),
                                            _mm512_and_si512(_mm512_slli_epi16(high, 4), m_high));
      const __m512i second = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), m4),
                                             _mm512_and_si512(high, m_high));
      const __m512i p0 = _mm512_maddubs_epi16(first, load64(xb + 128 * n));
      const __m512i p1 = _mm512_maddubs_epi16(second, load64(xb + 128 * n + 64));
      sum = _mm512_dpwssd_epi32(sum, p0, _mm512_permutexvar_epi16(pick[2 * n], scales));
      sum = _mm512_dpwssd_epi32(sum, p1, _mm512_permutexvar_epi16(pick[2 * n + 1], scales));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(half_at(b + 208) * x.d[blk]), _mm512_cvtepi32_ps(sum), acc);
  }
  return hsum512(acc);
}

// Q5_0 (22-byte blocks of 32) and Q8_0 (34), two blocks a vector: the weights' q as unsigned
// bytes u = q + offset (Q5_0: the nibble with its fifth bit, offset 16; Q8_0: q xor 0x80, offset
// 128), so that vpdpbusd multiplies them with the input's signed q; offset times the input's
// sums of 4, by another vpdpbusd, is taken back in int32: each lane holds the same exact sum of
// 4 products as the 256-bit kernel's. Its fp32 steps then follow that kernel's: block after
// block, even blocks on one accumulator and odd ones on another (the same bits).
template <int64_t type>
float row_dot_small_blocks_512(const uint8_t* row, const InputQ8& x, int64_t k) {
  constexpr int64_t bb = type == Q5_0 ? 22 : 34;
  const int64_t n = k / 32;
  const int8_t* xq = x.q.data();
  // Q5_0: [qs0 | qs1] (16 bytes each) -> [qs0, qs0, qs1, qs1], the second of each pair shifted
  // by 4 in its 16-bit lanes: low nibbles are values 0..15, high nibbles 16..31
  const __m512i pairs = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
  const int64_t four = 0x0004000400040004;
  const __m512i shifts = _mm512_set_epi64(four, four, 0, 0, four, four, 0, 0);
  const __m512i m4 = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(16);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i offset = type == Q5_0 ? fifth : flip;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t blk = 0;
  for (; blk + 1 < n; blk += 2) {
    const uint8_t* b0 = row + blk * bb;
    const uint8_t* b1 = b0 + bb;
    prefetch_ahead(b0, 2 * bb);
    __m512i u;
    if constexpr (type == Q5_0) {
      const __m256i qs =
          _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 6))),
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + 6)), 1);
      const __m512i nib =
          _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi64(pairs, _mm512_castsi256_si512(qs)), shifts), m4);
      uint32_t h0, h1;
      std::memcpy(&h0, b0 + 2, 4);
      std::memcpy(&h1, b1 + 2, 4);
      u = _mm512_mask_add_epi8(nib, _cvtu64_mask64(h0 | (static_cast<uint64_t>(h1) << 32)), nib, fifth);
    } else {
      const __m512i q =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2))),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + 2)), 1);
      u = _mm512_xor_si512(q, flip);
    }
    const __m512i xs = load64(xq + blk * 32);
    const __m512i s = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xs),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, xs));
    const __m256 s0 = _mm256_set1_ps(half_at(b0) * x.d[blk]), s1 = _mm256_set1_ps(half_at(b1) * x.d[blk + 1]);
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm512_castsi512_si256(s)), s0, acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(s, 1)), s1, acc1);
  }
  if (blk < n) {
    const uint8_t* b = row + blk * bb;
    const __m256i q = type == Q5_0 ? q5_0_values(b) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot4_signed(q, load32(xq + blk * 32))),
                           _mm256_set1_ps(half_at(b) * x.d[blk]), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

}  // namespace ggml_blocks
