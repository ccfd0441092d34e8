// Prefill's many-row products x W^T with x in int8, computed as decode's matvec computes one row
// (ggml_blocks.h): each row of x quantized to llama.cpp's Q8_K (K-quant weights) or Q8_0 (Q5_0,
// Q8_0 weights) by ggml_input_q8.h, the weights' q times its q summed in integers, exact, per
// group of 16 or 32, then scaled. The same integers as matvec's; only the order of the fp32
// sums differs. A GEMM on AVX-512 VNNI: vpdpbusd multiplies 64 byte pairs an instruction, twice
// the bf16 dot product's rate (benchmarks/dot_rates.py: 490 against 245 G multiply-adds/s a
// core on an AMD EPYC). With the weights unpacked and the inputs quantized at each call, the
// products of a Llama-3.2-1B-shape block ran 1.5x the bf16 tiles on oneDNN's GEMM, side by side
// (benchmarks/prefill_products.py; 1.2x on its 512-row k and v, 1.6x on the FFN).
//
// Layout: the 16 lanes of a vector are 16 rows of x (tokens), so that a weight's 4 bytes are one
// broadcast and W needs no transpose, only unpacking to int8 (`Unpacked`). vpdpbusd multiplies
// unsigned by signed bytes: x goes in as q + 128 (`InputTiles`), the weights as signed q, and
// each group's sum starts from -128 times the sum of its weights' q, so that it ends at sum q x.
// Per group of a K-quant, that int32 sum times the group's integer scale is added to the block's
// int32 total (exact); per block of 256, the total times d and the input's scale goes to fp32,
// and Q4_K's mins (its 6-bit m times the input's sums of 32) by vpdpwssd. Q5_0 and Q8_0 scale
// each block of 32 in fp32.
//
// Where the build has no AVX-512 VNNI, the rows run one by one through matvec: the same values.
#pragma once

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "ggml_blocks.h"

#if defined(MSA_AVX512) && defined(MSA_GGML_VNNI)
#define MSA_GEMM_INT8 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#endif

namespace ggml_blocks {

#ifdef MSA_GEMM_INT8

constexpr int64_t kTokens = 16;  // rows of x a vector holds

// x [m, k] quantized row by row as matvec does, laid out for the kernels. Rows m..m_pad-1 are 0.
struct InputTiles {
  int64_t m = 0, m_pad = 0, k = 0, per = 0;  // per: values a scale (256: Q8_K, 32: Q8_0)
  std::vector<uint8_t> u;          // [m_pad / 16][k / 4][16][4]: q + 128
  std::vector<float> d;            // [m_pad / 16][k / per][16]
  std::vector<int32_t> sum_pairs;  // Q8_K: [m_pad / 16][k / 64][16]: the sums of q over values
                                   // 64i..64i+31 and 64i+32..64i+63, as two int16
  const uint8_t* u_at(int64_t tile, int64_t step) const { return u.data() + ((tile * (k / 4)) + step) * 64; }
};

inline void quantize_tiles(const float* x, int64_t m, int64_t k, bool q8_k, InputTiles& in) {
  in.m = m;
  in.m_pad = (m + kTokens - 1) / kTokens * kTokens;
  in.k = k;
  in.per = q8_k ? 256 : 32;
  in.u.assign(static_cast<size_t>(in.m_pad * k), 128);
  in.d.assign(static_cast<size_t>(in.m_pad * (k / in.per)), 0.f);
  if (q8_k) in.sum_pairs.assign(static_cast<size_t>(in.m_pad * (k / 64)), 0);
  at::parallel_for(0, m, 8, [&](int64_t first, int64_t last) {
    InputQ8 q;
    for (int64_t r = first; r < last; ++r) {
      const int64_t tile = r / kTokens, lane = r % kTokens;
      if (q8_k)
        quantize_q8_K(x + r * k, k, q);
      else
        quantize_q8_0(x + r * k, k, q);
      uint8_t* u = in.u.data() + tile * k * kTokens + lane * 4;
      for (int64_t s = 0; s < k / 4; ++s) {  // q + 128: the sign bit flipped
        uint32_t four;
        std::memcpy(&four, q.q.data() + s * 4, 4);
        four ^= 0x80808080u;
        std::memcpy(u + s * 64, &four, 4);
      }
      for (int64_t b = 0; b < k / in.per; ++b) in.d[(tile * (k / in.per) + b) * kTokens + lane] = q.d[b];
      if (!q8_k) continue;
      for (int64_t i = 0; i < k / 64; ++i) {
        const int32_t low = q.sums[4 * i] + q.sums[4 * i + 1], high = q.sums[4 * i + 2] + q.sums[4 * i + 3];
        in.sum_pairs[(tile * (k / 64) + i) * kTokens + lane] =
            static_cast<int32_t>(static_cast<uint16_t>(low) | (static_cast<uint32_t>(high) << 16));
      }
    }
  });
}

// Rows of W unpacked for the kernels: per row, its k values as int8 q and per group of
// `group` values (Q4_K 32, Q6_K 16, Q5_0 / Q8_0 32) the start of the group's sum (-128 times the
// sum of its q) and its integer scale; per block of 256 (K-quants) or 32 its fp32 d; Q4_K also
// dmin per block and its 6-bit mins in pairs (two int16 a word: vpdpwssd's operand).
struct Unpacked {
  int64_t k = 0, group = 0, per = 0;  // per: values a d
  std::vector<int8_t> q;              // [rows][k]
  std::vector<int32_t> start, scale;  // [rows][k / group]
  std::vector<float> d, dmin;         // [rows][k / per]
  std::vector<int32_t> offset;        // K-quants: [rows][k / 256]: the block's starts times their scales
  std::vector<int32_t> min_pairs;     // Q4_K: [rows][k / 64]

  void resize(int64_t type, int64_t rows, int64_t k_) {
    k = k_;
    group = type == Q6_K ? 16 : 32;
    per = k_quant(type) ? 256 : 32;
    q.resize(static_cast<size_t>(rows * k));
    start.resize(static_cast<size_t>(rows * (k / group)));
    scale.resize(start.size());
    d.resize(static_cast<size_t>(rows * (k / per)));
    offset.resize(d.size());
    if (type == Q4_K) {
      dmin.resize(d.size());
      min_pairs.resize(static_cast<size_t>(rows * (k / 64)));
    }
  }
};

// The sum of 32 signed bytes.
GGML_INLINE int32_t byte_sum(__m256i v) {
  const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))),
                                      _mm256_setzero_si256());
  const __m128i s = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
  return static_cast<int32_t>(_mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1)) - 32 * 128;
}

// Row `r` of `out` from the row's blocks at `row`.
inline void unpack_row(int64_t type, const uint8_t* row, int64_t r, Unpacked& out) {
  const int64_t k = out.k, groups = k / out.group;
  int8_t* q = out.q.data() + r * k;
  int32_t* start = out.start.data() + r * groups;
  int32_t* scale = out.scale.data() + r * groups;
  float* d = out.d.data() + r * (k / out.per);
  const auto put = [&](__m256i v, int64_t at) {  // 32 values from `at`, their group starts
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + at), v);
    if (out.group == 32) {
      start[at / 32] = -128 * byte_sum(v);
    } else {
      const __m256i halves[2] = {_mm256_and_si256(v, _mm256_set_epi64x(0, 0, -1, -1)),
                                 _mm256_and_si256(v, _mm256_set_epi64x(-1, -1, 0, 0))};
      for (int h = 0; h < 2; ++h) start[at / 16 + h] = -128 * byte_sum(halves[h]);
    }
  };
  if (type == Q4_K) {
    for (int64_t blk = 0; blk < k / 256; ++blk) {
      const uint8_t* b = row + blk * 144;
      alignas(16) uint8_t sm[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(sm), q4k_scales_mins(b));
      d[blk] = half_at(b);
      out.dmin[r * (k / 256) + blk] = half_at(b + 2);
      for (int j = 0; j < 8; ++j) scale[blk * 8 + j] = sm[j];
      for (int i = 0; i < 4; ++i)
        out.min_pairs[r * (k / 64) + blk * 4 + i] = sm[8 + 2 * i] | (static_cast<int32_t>(sm[9 + 2 * i]) << 16);
      for (int j = 0; j < 4; ++j) {
        __m256i v[2];
        q4k_values(b, j, v);
        put(v[0], blk * 256 + 64 * j);
        put(v[1], blk * 256 + 64 * j + 32);
      }
    }
  } else if (type == Q6_K) {
    for (int64_t blk = 0; blk < k / 256; ++blk) {
      const uint8_t* b = row + blk * 210;
      d[blk] = half_at(b + 208);
      for (int g = 0; g < 16; ++g) scale[blk * 16 + g] = reinterpret_cast<const int8_t*>(b + 192)[g];
      for (int n = 0; n < 2; ++n) {
        __m256i v[4];
        q6k_values(b, n, v);
        for (int part = 0; part < 4; ++part)
          put(_mm256_sub_epi8(v[part], _mm256_set1_epi8(32)), blk * 256 + 128 * n + 32 * part);
      }
    }
  } else {
    const int64_t bb = block_bytes(type);
    for (int64_t blk = 0; blk < k / 32; ++blk) {
      const uint8_t* b = row + blk * bb;
      d[blk] = half_at(b);
      scale[blk] = 1;
      put(type == Q5_0 ? q5_0_values(b) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), blk * 32);
    }
  }
  if (!k_quant(type)) return;
  const int64_t per_block = 256 / out.group;
  for (int64_t blk = 0; blk < k / 256; ++blk) {
    int32_t sum = 0;
    for (int64_t j = blk * per_block; j < (blk + 1) * per_block; ++j) sum += start[j] * scale[j];
    out.offset[r * (k / 256) + blk] = sum;
  }
}

// The 4 bytes of q at `p` on every lane.
GGML_INLINE __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// One group's integer sums for T vectors of tokens and C rows of W, the group's G values from
// `at`, added to acc[t][c]: the sums of q times x + 128.
template <int T, int C, int G>
GGML_INLINE void group_sums(const uint8_t* const (&x)[T], const int8_t* const (&q)[C], int64_t at,
                            __m512i (&acc)[T][C]) {
#pragma GCC unroll 8
  for (int step = 0; step < G / 4; ++step) {
    __m512i xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_si512(x[t] + (at / 4 + step) * 64);
    for (int c = 0; c < C; ++c) {
      const __m512i wq = broadcast4(q[c] + at + step * 4);
      for (int t = 0; t < T; ++t) acc[t][c] = _mm512_dpbusd_epi32(acc[t][c], xv[t], wq);
    }
  }
}

// Pointers to the tiles' inputs and the rows' q.
template <int T, int C>
struct TilePointers {
  const uint8_t* x[T];
  const int8_t* q[C];
  const int32_t *start[C], *scale[C];
  TilePointers(const InputTiles& in, int64_t t0, const Unpacked& w, int64_t c0) {
    for (int t = 0; t < T; ++t) x[t] = in.u_at(t0 + t, 0);
    for (int c = 0; c < C; ++c) {
      q[c] = w.q.data() + (c0 + c) * w.k;
      start[c] = w.start.data() + (c0 + c) * (w.k / w.group);
      scale[c] = w.scale.data() + (c0 + c) * (w.k / w.group);
    }
  }
};

// The products of tokens of tiles t0..t0+T-1 and rows c0..c0+C-1 over values `from`..`to`
// (whole blocks), added to acc[c][t * 16 + lane] (acc: [rows][T * 16], rows c0.. of the run).
// K-quants: the int32 group sums and block totals fill the registers; the fp32 sums stay in acc.
template <int T, int C, int G, bool kMins>
void tile_k_quant(const InputTiles& in, int64_t t0, const Unpacked& w, int64_t c0, int64_t from, int64_t to,
                  float* acc) {
  const int64_t k = w.k;
  constexpr int64_t per_block = 256 / G;
  const TilePointers<T, C> p(in, t0, w, c0);
  for (int64_t blk = from / 256; blk < to / 256; ++blk) {
    __m512i total[T][C];  // from the block's starts times scales: undoes the inputs' 128
    for (int c = 0; c < C; ++c) {
      const __m512i offset = _mm512_set1_epi32(w.offset[(c0 + c) * (k / 256) + blk]);
      for (int t = 0; t < T; ++t) total[t][c] = offset;
    }
    for (int64_t j = 0; j < per_block; ++j) {
      const int64_t g = blk * per_block + j;
      __m512i sums[T][C];
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c) sums[t][c] = _mm512_setzero_si512();
      group_sums<T, C, G>(p.x, p.q, g * G, sums);
      for (int c = 0; c < C; ++c) {
        const __m512i s = _mm512_set1_epi32(p.scale[c][g]);
        for (int t = 0; t < T; ++t) total[t][c] = _mm512_add_epi32(total[t][c], _mm512_mullo_epi32(sums[t][c], s));
      }
    }
    for (int t = 0; t < T; ++t) {
      const __m512 dx = _mm512_loadu_ps(in.d.data() + ((t0 + t) * (k / 256) + blk) * kTokens);
      __m512i pairs[4];
      if constexpr (kMins)
        for (int i = 0; i < 4; ++i)
          pairs[i] = _mm512_loadu_si512(in.sum_pairs.data() + ((t0 + t) * (k / 64) + blk * 4 + i) * kTokens);
      for (int c = 0; c < C; ++c) {
        const int64_t row = c0 + c;
        float* o = acc + (row * T + t) * kTokens;
        __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[t][c]),
                                   _mm512_mul_ps(_mm512_set1_ps(w.d[row * (k / 256) + blk]), dx), _mm512_loadu_ps(o));
        if constexpr (kMins) {
          __m512i mins = _mm512_setzero_si512();
          for (int i = 0; i < 4; ++i)
            mins = _mm512_dpwssd_epi32(mins, pairs[i], _mm512_set1_epi32(w.min_pairs[row * (k / 64) + blk * 4 + i]));
          y = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(_mm512_set1_ps(w.dmin[row * (k / 256) + blk]), dx),
                               y);
        }
        _mm512_storeu_ps(o, y);
      }
    }
  }
}

// Q5_0 and Q8_0: each block of 32's sums scaled in fp32, in registers over from..to.
template <int T, int C>
void tile_small_blocks(const InputTiles& in, int64_t t0, const Unpacked& w, int64_t c0, int64_t from, int64_t to,
                       float* acc) {
  const int64_t k = w.k;
  const TilePointers<T, C> p(in, t0, w, c0);
  __m512 y[T][C];
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) y[t][c] = _mm512_loadu_ps(acc + ((c0 + c) * T + t) * kTokens);
  for (int64_t blk = from / 32; blk < to / 32; ++blk) {
    __m512i sums[T][C];
    for (int c = 0; c < C; ++c) {
      const __m512i start = _mm512_set1_epi32(p.start[c][blk]);  // undoes the inputs' 128
      for (int t = 0; t < T; ++t) sums[t][c] = start;
    }
    group_sums<T, C, 32>(p.x, p.q, blk * 32, sums);
    for (int t = 0; t < T; ++t) {
      const __m512 dx = _mm512_loadu_ps(in.d.data() + ((t0 + t) * (k / 32) + blk) * kTokens);
      for (int c = 0; c < C; ++c)
        y[t][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[t][c]),
                                  _mm512_mul_ps(_mm512_set1_ps(w.d[(c0 + c) * (k / 32) + blk]), dx), y[t][c]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + ((c0 + c) * T + t) * kTokens, y[t][c]);
}

template <int T, int C>
void tile(int64_t type, const InputTiles& in, int64_t t0, const Unpacked& w, int64_t c0, int64_t from, int64_t to,
          float* acc) {
  if (type == Q4_K)
    tile_k_quant<T, C, 32, true>(in, t0, w, c0, from, to, acc);
  else if (type == Q6_K)
    tile_k_quant<T, C, 16, false>(in, t0, w, c0, from, to, acc);
  else
    tile_small_blocks<T, C>(in, t0, w, c0, from, to, acc);
}

// T and C: 12 int32 sums and 12 block totals in registers (3 x 4 measured the fastest of
// 1 x 8, 2 x 4, 3 x 4 and 4 x 3)
constexpr int kTileVectors = 3, kTileRows = 4;
static_assert(kTileVectors == 3, "linear_int8_parts takes a last 1 or 2 tiles of tokens on their own");
// Values of x a pass over a run's rows reads at a time: T * 16 rows of them, 24 KB, stay in L1
// while the run's tiles of C rows pass over them.
constexpr int64_t kChunk = 512;

// The run's `rows` unpacked rows times the tokens of tiles t0..t0+T-1, into y [m, n] at columns
// n0...: over chunks of kChunk values, each chunk's tiles of C rows after one another.
template <int T>
void tiles_of_rows(int64_t type, const InputTiles& in, int64_t t0, const Unpacked& w, int64_t rows,
                   std::vector<float>& acc, float* y, int64_t n, int64_t n0) {
  acc.assign(static_cast<size_t>(rows * T * kTokens), 0.f);
  for (int64_t from = 0; from < w.k; from += kChunk) {
    const int64_t to = std::min(w.k, from + kChunk);
    int64_t c = 0;
    for (; c + kTileRows <= rows; c += kTileRows) tile<T, kTileRows>(type, in, t0, w, c, from, to, acc.data());
    switch (rows - c) {
      case 3: tile<T, 3>(type, in, t0, w, c, from, to, acc.data()); break;
      case 2: tile<T, 2>(type, in, t0, w, c, from, to, acc.data()); break;
      case 1: tile<T, 1>(type, in, t0, w, c, from, to, acc.data()); break;
      default: break;
    }
  }
  const int64_t tokens = std::min<int64_t>(T * kTokens, in.m - t0 * kTokens);
  for (int64_t i = 0; i < tokens; ++i) {
    float* out = y + (t0 * kTokens + i) * n + n0;
    const int64_t t = i / kTokens, lane = i % kTokens;
    for (int64_t c = 0; c < rows; ++c) out[c] = acc[(c * T + t) * kTokens + lane];
  }
}

#endif  // MSA_GEMM_INT8

// Each part's y [m, n_rows] = x W^T for x fp32 [m, k] and parts laid out as matvec_parts'
// (their y now [m, n_rows]): each row of x quantized once for every part of its format, as
// matvec quantizes it. The parts' rows go in runs of about 256 KB of unpacked weights (which
// stay in the core's L2 while every row of x passes), taken by the threads as they finish: one
// parallel region for a layer's q, k and v or its gate and up.
inline void linear_int8_parts(const MatvecPart* parts, int64_t n_parts, int64_t k, const float* x, int64_t m) {
#ifdef MSA_GEMM_INT8
  InputTiles q8_k, q8_0;  // the K-quants' input format, and Q5_0's and Q8_0's
  const auto [need_k, need_0] = input_formats(parts, n_parts);
  if (need_k) quantize_tiles(x, m, k, true, q8_k);
  if (need_0) quantize_tiles(x, m, k, false, q8_0);
  const int64_t run = std::max<int64_t>(kTileRows, (int64_t{1} << 18) / k / kTileRows * kTileRows);
  std::vector<std::pair<int64_t, int64_t>> runs;  // (part, first row)
  for (int64_t i = 0; i < n_parts; ++i)
    for (int64_t n0 = 0; n0 < parts[i].n_rows; n0 += run) runs.emplace_back(i, n0);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(static_cast<int64_t>(runs.size()), at::get_num_threads()), 1,
                   [&](int64_t, int64_t) {
                     Unpacked w;
                     std::vector<float> acc;
                     for (int64_t r = next++; r < static_cast<int64_t>(runs.size()); r = next++) {
                       const MatvecPart& part = parts[runs[r].first];
                       const InputTiles& in = k_quant(part.type) ? q8_k : q8_0;
                       const int64_t n0 = runs[r].second, rows = std::min(run, part.n_rows - n0);
                       w.resize(part.type, run, k);
                       for (int64_t i = 0; i < rows; ++i) {
                         const int64_t row = part.row_ids ? part.row_ids[n0 + i] : n0 + i;
                         unpack_row(part.type, part.base + row * part.row_bytes, i, w);
                       }
                       const int64_t tiles = in.m_pad / kTokens;
                       int64_t t = 0;
                       for (; t + kTileVectors <= tiles; t += kTileVectors)
                         tiles_of_rows<kTileVectors>(part.type, in, t, w, rows, acc, part.y, part.n_rows, n0);
                       if (tiles - t == 2) tiles_of_rows<2>(part.type, in, t, w, rows, acc, part.y, part.n_rows, n0);
                       if (tiles - t == 1) tiles_of_rows<1>(part.type, in, t, w, rows, acc, part.y, part.n_rows, n0);
                     }
                   });
#else
  for (int64_t i = 0; i < n_parts; ++i)
    for (int64_t r = 0; r < m; ++r) {
      const MatvecPart& p = parts[i];
      matvec(p.type, p.base, p.row_bytes, p.row_ids, p.n_rows, k, x + r * k, p.y + r * p.n_rows);
    }
#endif
}

}  // namespace ggml_blocks

#ifdef MSA_GEMM_INT8
#pragma GCC pop_options
#endif
