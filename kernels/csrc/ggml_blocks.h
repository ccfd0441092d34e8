// Products with weights kept in a GGUF's own blocks (llama.cpp's ggml-common.h layouts), read
// straight from the file's memory map: Q4_K, Q6_K, Q5_0 and Q8_0, the types of a Q4_K_M file.
//
// Every one of these types is, per group of 16 or 32 weights, `w = scale * q + min` with small
// integers q (Q4_K: 0..15, min -dmin * m; Q6_K: -32..31, Q5_0: -16..15, Q8_0: int8, min 0). A
// block is unpacked into int8 q and its groups' scale and min (a few vector operations), then
// either written out as fp32 (`dequantize_rows`, for prefill: then a GEMM; the reference
// dequantization's values, gguf.quants, llama.cpp's own, to fp32 rounding) or multiplied with
// the input quantized to int8 (`matvec`, for decode, as llama.cpp computes it: the input in
// its Q8_0 or Q8_K format, ggml_input_q8.h): per block, the integer sums of q times the
// input's q, exact (AVX-512 VNNI or AVX-VNNI dot products, AVX2's maddubs, or plain loops: the
// same integers on every CPU), scaled in fp32; Q4_K's mins times the input's sums. Output heads
// may keep the fp32 input (`matvec_fp32`): logits exact to the weights.
//
// Header-only: decoder_step.cpp (the fused step) and ggml_blocks.cpp (the per-op kernels) both
// compile it.
// Split by job: ggml_block_types.h (types and sizes), ggml_input_q8.h (the input in int8),
// ggml_blocks_avx2.h (the SIMD kernels) or ggml_blocks_portable.h (the same without
// intrinsics), and here the row loops over threads.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "ggml_block_types.h"

// With MSA_AVX512 and/or MSA_GGML_VNNI defined (the build's choice, cpp_build.py, from
// what the CPU has), these kernels alone are compiled for them: the code that includes them
// keeps its own flags.
#if defined(MSA_AVX512) && defined(MSA_GGML_VNNI)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#elif defined(MSA_AVX512)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
#elif defined(MSA_GGML_VNNI)
#pragma GCC push_options
#pragma GCC target("avxvnni")
#endif

#ifdef __AVX2__
#include "ggml_blocks_avx2.h"
#else
#include "ggml_blocks_portable.h"
#endif

namespace ggml_blocks {

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

// f(first, last) over rows 0..n_rows-1 in runs of about 64 KB of weights, which the threads
// take in turn as they finish: a decode step is a few hundred matvecs, each ended by waiting for
// the slowest thread, and on a shared machine one thread's half is often late (static halves
// left the other waiting 11% of an 8B-shape step; taken as they finish, a sweep of every
// matvec of that model ran 160 -> 149 ms, measured side by side).
template <typename F>
void share_rows(int64_t n_rows, int64_t row_bytes, const F& f) {
  const int64_t min_run = std::max<int64_t>(4, (int64_t{1} << 16) / std::max<int64_t>(1, row_bytes));
  const int64_t threads = at::get_num_threads();
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>((n_rows + min_run - 1) / min_run, threads), 1, [&](int64_t, int64_t) {
    for (;;) {
      int64_t first = next.load();
      int64_t run;
      do {
        if (first >= n_rows) return;
        run = std::max(min_run, (n_rows - first) / (2 * threads));
      } while (!next.compare_exchange_weak(first, first + run));
      f(first, std::min(n_rows, first + run));
    }
  });
}

// One matrix of a matvec: `n_rows` rows of weights laid out as in dequantize_rows, and where
// its outputs go.
struct MatvecPart {
  int64_t type;
  const uint8_t* base;
  int64_t row_bytes;
  const int64_t* row_ids;  // or nullptr: rows in order
  int64_t n_rows;
  float* y;  // [n_rows]
};

// Which input formats parts read: (the K-quants', Q5_0's and Q8_0's).
inline std::pair<bool, bool> input_formats(const MatvecPart* parts, int64_t n_parts) {
  std::pair<bool, bool> need{false, false};
  for (int64_t i = 0; i < n_parts; ++i) (k_quant(parts[i].type) ? need.first : need.second) = true;
  return need;
}

// Each part's y = W x for parts that read the same x [k], with x quantized to int8 first
// (ggml_input_q8.h), as llama.cpp computes a matvec: once for every part of its input format,
// and the parts' rows taken by the threads as one run of rows (a layer's q, k and v, or its
// gate and up: one parallel region and one wait for the slowest thread, not one each).
inline void matvec_parts(const MatvecPart* parts, int64_t n_parts, int64_t k, const float* x) {
  InputQ8 q8_k, q8_0;  // the K-quants' input format, and Q5_0's and Q8_0's
  const auto [need_k, need_0] = input_formats(parts, n_parts);
  std::vector<int64_t> starts(static_cast<size_t>(n_parts) + 1, 0);
  int64_t min_row_bytes = parts[0].row_bytes;
  for (int64_t i = 0; i < n_parts; ++i) {
    starts[i + 1] = starts[i] + parts[i].n_rows;
    min_row_bytes = std::min(min_row_bytes, parts[i].row_bytes);
  }
  if (need_k) quantize_q8_K(x, k, q8_k);
  if (need_0) quantize_q8_0(x, k, q8_0);
  share_rows(starts[n_parts], min_row_bytes, [&](int64_t first, int64_t last) {
    int64_t p = 0;
    for (int64_t r = first; r < last;) {
      while (r >= starts[p + 1]) ++p;
      const MatvecPart& m = parts[p];
      const InputQ8& xq = k_quant(m.type) ? q8_k : q8_0;
      for (const int64_t end = std::min(last, starts[p + 1]); r < end; ++r) {
        const int64_t i = r - starts[p];
        m.y[i] = row_dot(m.type, m.base + (m.row_ids ? m.row_ids[i] : i) * m.row_bytes, xq, k);
      }
    }
  });
}

// y [n_rows] = W x: matvec_parts for one matrix.
inline void matvec(int64_t type, const uint8_t* base, int64_t row_bytes, const int64_t* row_ids, int64_t n_rows,
                   int64_t k, const float* x, float* y) {
  const MatvecPart part{type, base, row_bytes, row_ids, n_rows, y};
  matvec_parts(&part, 1, k, x);
}

// The same in fp32, the exact weights times x (an output head's logits).
inline void matvec_fp32(int64_t type, const uint8_t* base, int64_t row_bytes, const int64_t* row_ids,
                        int64_t n_rows, int64_t k, const float* x, float* y) {
  share_rows(n_rows, row_bytes, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      y[r] = row_dot_fp32(type, base + (row_ids ? row_ids[r] : r) * row_bytes, x, k);
  });
}

}  // namespace ggml_blocks

#if defined(MSA_AVX512) || defined(MSA_GGML_VNNI)
#pragma GCC pop_options
#endif
