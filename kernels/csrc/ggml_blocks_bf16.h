// bf16 tiles of a GGUF's blocks for the many-row products of prefill, on CPUs whose matrix units
// multiply bf16 (AMX): rows dequantized as dequantize_rows does (fp32 values, the reference's),
// each value then rounded to bf16 (to nearest, ties to even: PyTorch's .to(torch.bfloat16)), and
// multiplied with bf16-rounded activations by PyTorch's brgemm (at::native::cpublas, oneDNN's
// micro-kernel: AMX tiles, sums kept in fp32, fp32 out). No fp32 tile is written: converting one
// to bf16 would add half the bf16 product's own time (measured: 8.4 ms to its 17.8).
#pragma once

#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>

#include <algorithm>

#include "ggml_blocks.h"

// the targets of ggml_blocks.h's kernels, whose block unpacking these inline
#if defined(MSA_AVX512) && defined(MSA_GGML_VNNI)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#elif defined(MSA_AVX512)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
#endif

namespace ggml_blocks {

// v rounded to bf16 (its bits), to nearest with ties to even; a NaN stays a (quiet) NaN.
inline uint16_t bf16_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// v [n] rounded as bf16_bits does (where the build has no AVX-512: with it, dequantize_block
// rounds in registers).
inline void round_to_bf16(const float* v, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits(v[i]);
}

// One row of k weights (its blocks at `row`) as bf16 bits: out [k]. With AVX-512 each block's
// fp32 values are rounded in registers (dequantize_block to bf16: the same bits).
inline void dequantize_row_bf16(int64_t type, const uint8_t* row, int64_t k, uint16_t* out) {
  const int64_t nv = block_values(type), bb = block_bytes(type), n_blocks = k / nv;
#ifdef MSA_AVX512
  for (int64_t blk = 0; blk < n_blocks; ++blk) dequantize_block(type, row + blk * bb, out + blk * nv);
#else
  const int64_t per = 256 / nv;  // blocks a batch: 256 values rounded at once
  alignas(64) float values[256];
  for (int64_t blk = 0; blk < n_blocks; blk += per) {
    const int64_t count = std::min(per, n_blocks - blk);
    for (int64_t i = 0; i < count; ++i) dequantize_block(type, row + (blk + i) * bb, values + i * nv);
    round_to_bf16(values, count * nv, out + blk * nv);
  }
#endif
}

// bf16 values of `n_rows` rows laid out as in dequantize_rows: out [n_rows, k].
inline void dequantize_rows_bf16(int64_t type, const uint8_t* base, int64_t row_bytes, const int64_t* row_ids,
                                 int64_t n_rows, int64_t k, uint16_t* out) {
  at::parallel_for(0, n_rows, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      dequantize_row_bf16(type, base + (row_ids ? row_ids[r] : r) * row_bytes, k, out + r * k);
  });
}

#ifdef MSA_AVX512
// 16 rows of 16 32-bit words, r[i] the i-th, transposed in place: r[j] becomes word j of every
// row. Per 128-bit lane the words are paired then the pairs (rows 4g..4g+3 of one word each);
// the lanes are then gathered across rows by two rounds of 128-bit shuffles.
inline void transpose16_words(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // u[g + j], lane L: word 4L + j of rows g..g+3
    r[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    r[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    r[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    r[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i v0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44), v1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
    t[j] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    t[4 + j] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    t[8 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    t[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}
#endif

// W's rows `first`..`first + cols - 1` (cols <= 64) as B = W^T [k, 64] in bf16, in VNNI pairs
// of k (B[k / 2][column][k % 2], the layout AMX reads): the rows' pairs of k, as 32-bit words,
// transposed. With AVX-512, 16 rows at a time, 256 values of each: dequantized and rounded into
// a tile that stays in L1, then transposed 16 x 16 words a step (row by row through a scratch
// of whole rows, then a word at a time, one cache line apart, took a fifth of a 1B-shape prefill
// on a Xeon with AMX, as long as the tiles' own products). Other columns: that way.
inline void pack_rows_bf16(int64_t type, const uint8_t* base, int64_t row_bytes, const int64_t* row_ids, int64_t first,
                           int64_t cols, int64_t k, uint16_t* scratch, uint16_t* b) {
  constexpr int64_t nb = 64;
  uint32_t* to = reinterpret_cast<uint32_t*>(b);
  const auto row = [&](int64_t c) { return base + (row_ids ? row_ids[first + c] : first + c) * row_bytes; };
  int64_t c0 = 0;
#ifdef MSA_AVX512
  const int64_t nv = block_values(type), bb = block_bytes(type);
  alignas(64) uint16_t tile[16 * 256];  // 16 rows of 256 values: 128 words a row
  const uint32_t* words = reinterpret_cast<const uint32_t*>(tile);
  for (; c0 + 16 <= cols; c0 += 16)
    for (int64_t kb = 0; kb < k; kb += 256) {
      const int64_t n = std::min<int64_t>(256, k - kb);  // a multiple of 32: whole 16-word steps
      for (int64_t i = 0; i < 16; ++i)  // each value as dequantize_block's, rounded (same bits)
        for (int64_t v = 0; v < n; v += nv)
          dequantize_block(type, row(c0 + i) + (kb + v) / nv * bb, tile + i * 256 + v);
      for (int64_t p0 = 0; p0 < n / 2; p0 += 16) {
        __m512i r[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(words + i * 128 + p0);
        transpose16_words(r);
        for (int i = 0; i < 16; ++i) _mm512_storeu_si512(to + (kb / 2 + p0 + i) * nb + c0, r[i]);
      }
    }
#endif
  for (int64_t c = c0; c < cols; ++c) dequantize_row_bf16(type, row(c), k, scratch + (c - c0) * k);
  const uint32_t* from = reinterpret_cast<const uint32_t*>(scratch);  // pairs of k as 32-bit words
  for (int64_t p = 0; p < k / 2; ++p)
    for (int64_t c = c0; c < cols; ++c) to[p * nb + c] = from[(c - c0) * (k / 2) + p];
}

// y [m, n] fp32 (row stride n) = x W^T on AMX tiles, for x bf16 [m, k] (row-major) and the n
// rows of W (laid out as in dequantize_rows). Each thread takes groups of blocks of 64 rows of
// W (B's width: oneDNN packs B in blocks of 16 to 64 columns), dequantizes them to bf16 once
// and packs them, then multiplies each chunk of rows of x with every block of the group while
// the chunk is in cache (a group about 512 kB, a chunk about 256 kB).
inline void linear_bf16_tiles(int64_t type, const uint8_t* base, int64_t row_bytes, const int64_t* row_ids,
                              int64_t n, int64_t k, const c10::BFloat16* x, int64_t m, float* y) {
  constexpr int64_t nb = 64;
  const int64_t group = std::clamp<int64_t>((int64_t{1} << 19) / (nb * k * 2), 1, 8), mb = 128;
  const int64_t n_blocks = (n + nb - 1) / nb;
  at::parallel_for(0, (n_blocks + group - 1) / group, 1, [&](int64_t first_group, int64_t last_group) {
    std::vector<uint16_t> scratch(static_cast<size_t>(nb * k));
    std::vector<c10::BFloat16> b(static_cast<size_t>(group * nb * k));
    uint16_t* bits = reinterpret_cast<uint16_t*>(b.data());
    for (int64_t g = first_group; g < last_group; ++g) {
      const int64_t first_block = g * group, blocks = std::min(group, n_blocks - first_block);
      for (int64_t j = 0; j < blocks; ++j) {
        const int64_t first = (first_block + j) * nb;
        pack_rows_bf16(type, base, row_bytes, row_ids, first, std::min(nb, n - first), k, scratch.data(),
                       bits + j * nb * k);
      }
      for (int64_t i = 0; i < m; i += mb)
        for (int64_t j = 0; j < blocks; ++j) {
          const int64_t first = (first_block + j) * nb;
          at::native::cpublas::brgemm(std::min(mb, m - i), std::min(nb, n - first), k, k, nb, n, false, x + i * k,
                                      b.data() + j * nb * k, y + i * n + first, true);
        }
    }
    at::native::cpublas::brgemm_release(true);
  });
}

}  // namespace ggml_blocks

#ifdef MSA_AVX512
#pragma GCC pop_options
#endif
