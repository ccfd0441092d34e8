// Products with weights kept in a GGUF's own blocks (llama.cpp's ggml-common.h layouts), read
// straight from the file's memory map: Q4_K, Q6_K, Q5_0 and Q8_0, the types of a Q4_K_M file.
//
// Every one of these types is, per group of 16 or 32 weights, `w = scale * q + min` with small
// integers q (Q4_K: 0..15, min -dmin * m; Q6_K: -32..31, Q5_0: -16..15, Q8_0: int8, min 0). A
// block is unpacked into int8 q and its groups' scale and min (byte operations the compiler
// vectorizes), then either written out as fp32 (`dequantize_rows`, for prefill: then a GEMM) or
// multiplied with fp32 activations (`matvec`, for decode): per group, scale * sum(q x) +
// min * sum(x), with sum(x) per group computed once per input. The values are the reference
// dequantization's (gguf.quants, llama.cpp's own) to fp32 rounding.
//
// Header-only: decoder_step.cpp (the fused step) and ggml_blocks.cpp (the per-op kernels) both
// compile it.
// Split by job: ggml_block_types.h (types and sizes), ggml_blocks_avx2.h (the SIMD kernels) or
// ggml_blocks_portable.h (the same without intrinsics), and here the row loops over threads.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "ggml_block_types.h"

// With MSA_GGML_AVX512 defined (the build's choice where the CPU has AVX-512 F/BW/VL), these
// kernels alone are compiled for it: the code that includes them keeps its own flags.
#ifdef MSA_GGML_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
#endif

#ifdef __AVX2__
#include "ggml_blocks_avx2.h"
#else
#include "ggml_blocks_portable.h"
#endif

namespace ggml_blocks {

// The sum of x over each group of 32: [k / 32] (Q4_K's mins multiply them).
inline std::vector<float> sums32(const float* x, int64_t k) {
  std::vector<float> s(static_cast<size_t>(k / 32));
  for (int64_t i = 0; i < k / 32; ++i) {
    float t = 0.f;
    for (int64_t j = 0; j < 32; ++j) t += x[i * 32 + j];
    s[i] = t;
  }
  return s;
}

// fp32 values of `n_rows` rows of `k` weights; row r is at base + row_ids[r] * row_bytes
// (row_ids null: r itself). out [n_rows, k].
inline void dequantize_rows(int64_t type, const uint8_t* base, int64_t row_bytes, const int64_t* row_ids,
                            int64_t n_rows, int64_t k, float* out) {
  const int64_t nv = block_values(type), bb = block_bytes(type);
  at::parallel_for(0, n_rows, 16, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const uint8_t* row = base + (row_ids ? row_ids[r] : r) * row_bytes;
      for (int64_t blk = 0; blk < k / nv; ++blk) dequantize_block(type, row + blk * bb, out + r * k + blk * nv);
    }
  });
}

// y [n_rows] = W x for `n_rows` rows of `k` weights laid out as in dequantize_rows.
inline void matvec(int64_t type, const uint8_t* base, int64_t row_bytes, const int64_t* row_ids, int64_t n_rows,
                   int64_t k, const float* x, float* y) {
  const std::vector<float> xs = sums32(x, k);
  at::parallel_for(0, n_rows, 8, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      y[r] = row_dot(type, base + (row_ids ? row_ids[r] : r) * row_bytes, x, xs.data(), k);
  });
}

}  // namespace ggml_blocks

#ifdef MSA_GGML_AVX512
#pragma GCC pop_options
#endif
