// Causal attention on bf16 dot products, for prefill on CPUs with AVX-512 BF16 (vdpbf16ps:
// pairs of bf16 multiplied and summed into fp32 lanes). See msa.kernels.attention_bf16, whose
// `attention_bf16_reference` is the definition in plain PyTorch this kernel is tested against.
//
// Batch b holds rows of queries (a KV head's G query heads folded with the queries) and the keys
// they may read; key j is visible to row r when 0 <= k_pos[j] <= q_pos[r] (the causal rule by
// positions: a dense chunk's keys at 0..T-1, or the gathered blocks of an MSA selection with -1
// for padding). Scores are the bf16 queries times the bf16 keys summed in fp32, scaled; the
// softmax runs in fp32 (flash attention's running max and sum, 64 keys at a time); the weights
// are rounded to bf16 and multiplied with the bf16 values, summed in fp32; the output is divided
// by the sum of the unrounded weights.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>


#ifdef MSA_AVX512_BF16
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include "attention_bf16_keys.h"
#include "avx512_exp2.h"
#endif

namespace {

#ifdef MSA_AVX512_BF16

using attention_bf16::kBlock;
using attention_bf16::kLanes;
using attention_bf16::PackedKeys;
constexpr int64_t kTiles = kBlock / kLanes;
constexpr int64_t kRows = 32;   // query rows of a task: each block of keys is read once for them
constexpr int64_t kGroup = 4;   // rows whose scores and outputs are summed in registers at once
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896341f;

inline __m512bh as_bf16(__m512i x) { return (__m512bh)x; }

// o[r][c0..c0+16*NZ) = o * alpha[r] + sum over the block's 64 keys of w[r][j] v[j][c], for the
// kGroup rows; w as bf16 pairs of keys (32 a row), v_block the block's packed values.
template <int NZ>
inline void add_values(float* o, int64_t d, int64_t c0, const float* alpha, const uint32_t* w, const uint32_t* v_block) {
  __m512 acc[kGroup][NZ];
  for (int64_t r = 0; r < kGroup; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
    for (int z = 0; z < NZ; ++z) acc[r][z] = _mm512_mul_ps(_mm512_loadu_ps(o + r * d + c0 + z * kLanes), a);
  }
  for (int64_t i = 0; i < kBlock / 2; ++i) {
    __m512bh vals[NZ];
    for (int z = 0; z < NZ; ++z) vals[z] = as_bf16(_mm512_loadu_si512(v_block + i * d + c0 + z * kLanes));
    for (int64_t r = 0; r < kGroup; ++r) {
      const __m512bh wr = as_bf16(_mm512_set1_epi32(static_cast<int>(w[r * (kBlock / 2) + i])));
      for (int z = 0; z < NZ; ++z) acc[r][z] = _mm512_dpbf16_ps(acc[r][z], wr, vals[z]);
    }
  }
  for (int64_t r = 0; r < kGroup; ++r)
    for (int z = 0; z < NZ; ++z) _mm512_storeu_ps(o + r * d + c0 + z * kLanes, acc[r][z]);
}

// The running softmax state of a task's rows: max m (log2 units), sums l (per lane) and the
// unnormalized outputs o [kRows, D].
struct RowState {
  float m[kRows];
  __m512 l[kRows];
  std::vector<float> o;
};

// One block of keys for kGroup rows r0..: scores (log2 units), the softmax step, the weighted
// values. `whole`: every key of the block is visible to every row (no mask).
void group_block(const uint32_t* q, int64_t pairs, int64_t d, const uint32_t* kb, const uint32_t* vb,
                 const int32_t* kpos, bool whole, const int32_t* pos, float scale2, RowState& st, int64_t r0) {
  __m512 s[kGroup][kTiles];
  for (int64_t r = 0; r < kGroup; ++r)
    for (int64_t t = 0; t < kTiles; ++t) s[r][t] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh keys[kTiles];
    for (int64_t t = 0; t < kTiles; ++t) keys[t] = as_bf16(_mm512_loadu_si512(kb + (t * pairs + p) * kLanes));
    for (int64_t r = 0; r < kGroup; ++r) {
      const __m512bh qr = as_bf16(_mm512_set1_epi32(static_cast<int>(q[r * pairs + p])));
      for (int64_t t = 0; t < kTiles; ++t) s[r][t] = _mm512_dpbf16_ps(s[r][t], qr, keys[t]);
    }
  }
  alignas(64) uint32_t w[kGroup][kBlock / 2];
  float alpha[kGroup];
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  for (int64_t r = 0; r < kGroup; ++r) {
    __mmask16 visible[kTiles];
    __m512 top = neg_inf;
    for (int64_t t = 0; t < kTiles; ++t) {
      s[r][t] = _mm512_mul_ps(s[r][t], _mm512_set1_ps(scale2));
      visible[t] = 0xffff;
      if (!whole) {
        const __m512i kp = _mm512_loadu_si512(kpos + t * kLanes);
        visible[t] = _mm512_cmpge_epi32_mask(kp, _mm512_setzero_si512()) &
                     _mm512_cmple_epi32_mask(kp, _mm512_set1_epi32(pos[r]));
      }
      top = _mm512_max_ps(top, _mm512_mask_mov_ps(neg_inf, visible[t], s[r][t]));
    }
    const float block_max = _mm512_reduce_max_ps(top);
    float& m = st.m[r0 + r];
    if (block_max == kNegInf) {  // the row sees nothing of this block
      alpha[r] = 1.f;
      std::fill(w[r], w[r] + kBlock / 2, 0u);
      continue;
    }
    const float m_new = std::max(m, block_max);
    alpha[r] = m == kNegInf ? 0.f : std::exp2(m - m_new);
    m = m_new;
    __m512 e[kTiles], sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < kTiles; ++t) {
      e[t] = _mm512_maskz_mov_ps(visible[t], exp2_nonpositive(_mm512_sub_ps(s[r][t], _mm512_set1_ps(m_new))));
      sum = _mm512_add_ps(sum, e[t]);
    }
    st.l[r0 + r] = _mm512_fmadd_ps(st.l[r0 + r], _mm512_set1_ps(alpha[r]), sum);
    for (int64_t t = 0; t < kTiles; t += 2)
      _mm512_store_si512(w[r] + t * kLanes / 2, (__m512i)_mm512_cvtne2ps_pbh(e[t + 1], e[t]));
  }
  float* o = st.o.data() + r0 * d;
  int64_t c0 = 0;
  for (; c0 + 4 * kLanes <= d; c0 += 4 * kLanes) add_values<4>(o, d, c0, alpha, w[0], vb);
  switch ((d - c0) / kLanes) {
    case 3: add_values<3>(o, d, c0, alpha, w[0], vb); break;
    case 2: add_values<2>(o, d, c0, alpha, w[0], vb); break;
    case 1: add_values<1>(o, d, c0, alpha, w[0], vb); break;
    default: break;
  }
}

// n <= kRows rows of one batch (bf16 q [n, D], positions q_pos [n]): out [n, D] fp32.
void attend_rows(const uint16_t* q, const int64_t* q_pos, int64_t n, int64_t d, const PackedKeys& keys, float scale,
                 float* out) {
  const int64_t pairs = d / 2, n_blocks = static_cast<int64_t>(keys.lo.size());
  std::vector<uint32_t> qrows(kRows * pairs, 0);  // padding rows: zeros
  std::copy(reinterpret_cast<const uint32_t*>(q), reinterpret_cast<const uint32_t*>(q) + n * pairs, qrows.begin());
  RowState st;
  st.o.assign(kRows * d, 0.f);
  int32_t pos[kRows];
  for (int64_t r = 0; r < kRows; ++r) {
    st.m[r] = kNegInf;
    st.l[r] = _mm512_setzero_ps();
    pos[r] = r < n ? static_cast<int32_t>(q_pos[r]) : -1;  // padding rows see nothing
  }
  const float scale2 = scale * kLog2e;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint32_t* kb = keys.k.data() + b * kBlock * pairs;
    const uint32_t* vb = keys.v.data() + b * (kBlock / 2) * d;
    const int32_t* kp = keys.pos.data() + b * kBlock;
    for (int64_t r0 = 0; r0 < n; r0 += kGroup) {
      const int64_t rows = std::min(kGroup, n - r0);
      const int64_t lowest = *std::min_element(pos + r0, pos + r0 + rows);
      const int64_t highest = *std::max_element(pos + r0, pos + r0 + rows);
      if (keys.lo[b] > highest) continue;  // no row of the group sees a key of this block
      const bool whole = keys.all_valid[b] && keys.hi[b] <= lowest;
      group_block(qrows.data() + r0 * pairs, pairs, d, kb, vb, kp, whole, pos + r0, scale2, st, r0);
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    const float l = _mm512_reduce_add_ps(st.l[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int64_t c = 0; c < d; ++c) out[r * d + c] = st.o[r * d + c] * inv;
  }
}

// Every batch's rows over its packed keys: tasks of kRows rows, split over the threads.
void attend_batches(const uint16_t* qd, const int64_t* qp, int64_t q_pos_step, int64_t batches, int64_t rows, int64_t d,
                    const std::vector<PackedKeys>& packed, float scale, float* od) {
  const int64_t tiles = (rows + kRows - 1) / kRows;
  at::parallel_for(0, batches * tiles, 1, [&](int64_t first, int64_t last) {
    for (int64_t task = first; task < last; ++task) {
      const int64_t b = task / tiles, r0 = (task % tiles) * kRows, n = std::min(kRows, rows - r0);
      attend_rows(qd + (b * rows + r0) * d, qp + b * q_pos_step + r0, n, d, packed[b], scale, od + (b * rows + r0) * d);
    }
  });
}

#endif  // MSA_AVX512_BF16

bool built_with_bf16() {
#ifdef MSA_AVX512_BF16
  return true;
#else
  return false;
#endif
}

// q bf16 [B, R, D] contiguous (D a multiple of 16, at most 512), q_pos int64 [B or 1, R].
void check_queries(const at::Tensor& q, const at::Tensor& q_pos) {
  TORCH_CHECK(built_with_bf16(), "built without AVX-512 BF16");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.dim() == 3 && q.is_contiguous(), "q: contiguous bf16 [B, R, D]");
  TORCH_CHECK(q.size(2) % 16 == 0 && q.size(2) <= 512, "head_dim must be a multiple of 16, at most 512");
  TORCH_CHECK(q_pos.scalar_type() == at::kLong && q_pos.dim() == 2 && q_pos.is_contiguous() &&
                  (q_pos.size(0) == 1 || q_pos.size(0) == q.size(0)) && q_pos.size(1) == q.size(1),
              "q_pos: contiguous int64 [B or 1, R]");
}

// q [B, R, D], k and v [B, T, D], all bf16 and contiguous; q_pos int64 [B or 1, R], k_pos int64
// [B or 1, T] (1: shared by every batch). Returns o [B, R, D] fp32.
at::Tensor attention(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor q_pos, at::Tensor k_pos, double scale) {
  check_queries(q, q_pos);
  const int64_t batches = q.size(0), rows = q.size(1), d = q.size(2), n_keys = k.size(1);
  for (const auto& t : {k, v})
    TORCH_CHECK(t.scalar_type() == at::kBFloat16 && t.dim() == 3 && t.is_contiguous(), "k, v: contiguous bf16 [B, T, D]");
  TORCH_CHECK(k.size(0) == batches && v.sizes() == k.sizes() && k.size(2) == d, "k, v must be [B, T, D] as q");
  TORCH_CHECK(k_pos.scalar_type() == at::kLong && k_pos.dim() == 2 && k_pos.is_contiguous() &&
                  (k_pos.size(0) == 1 || k_pos.size(0) == batches) && k_pos.size(1) == n_keys,
              "k_pos: contiguous int64 [B or 1, T]");
  at::Tensor out = at::empty({batches, rows, d}, at::kFloat);
#ifdef MSA_AVX512_BF16
  const auto* kd = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
  const auto* vd = reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>());
  const int64_t* kp = k_pos.data_ptr<int64_t>();
  const int64_t k_pos_step = k_pos.size(0) == 1 ? 0 : n_keys;
  std::vector<PackedKeys> packed(batches);
  at::parallel_for(0, batches, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b)
      attention_bf16::pack_keys(kd + b * n_keys * d, vd + b * n_keys * d, kp + b * k_pos_step, n_keys, d, packed[b]);
  });
  attend_batches(reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>()), q_pos.data_ptr<int64_t>(),
                 q_pos.size(0) == 1 ? 0 : rows, batches, rows, d, packed, static_cast<float>(scale),
                 out.data_ptr<float>());
#endif
  return out;
}

// MSA's selected blocks read from the K/V cache in place: q [Hkv * nq, R, D] bf16 (batch
// h * nq + j: KV head h's rows of query block j), q_pos [Hkv * nq or 1, R]; k, v [Hkv, T, D]
// (fp32, fp16 or bf16, rows contiguous: a T-slice of a larger store is read in place); idx int32
// [Hkv, nq, K] (-1: unused slot) of `block_size` tokens; cos, sin fp32 [Hkv, nq, K, r] rotating
// each slot's keys (empty: keys as stored). Keys less their batch's mean visible key, rounded to
// bf16; key t visible to row r when t <= q_pos[r]. Returns o [Hkv * nq, R, D] fp32.
at::Tensor attention_blocks(at::Tensor q, at::Tensor q_pos, at::Tensor k, at::Tensor v, at::Tensor idx,
                            int64_t block_size, at::Tensor cos, at::Tensor sin, double scale) {
  check_queries(q, q_pos);
  const int64_t rows = q.size(1), d = q.size(2);
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k.size(2) == d && k.scalar_type() == v.scalar_type() &&
                  k.stride(2) == 1 && k.stride(1) == d && v.stride(2) == 1 && v.stride(1) == d &&
                  k.stride(0) == v.stride(0),
              "k, v: [Hkv, T, D] as q, rows contiguous, one dtype and layout");
  TORCH_CHECK(idx.scalar_type() == at::kInt && idx.dim() == 3 && idx.is_contiguous() && idx.size(0) == k.size(0) &&
                  idx.size(0) * idx.size(1) == q.size(0),
              "idx: contiguous int32 [Hkv, nq, K], Hkv * nq batches of q");
  TORCH_CHECK(block_size >= 1, "block_size must be at least 1");
  const int64_t hkv = idx.size(0), nq = idx.size(1), slots = idx.size(2);
  const bool rotated = cos.numel() > 0;
  const int64_t r = rotated ? cos.size(-1) : 0;
  if (rotated)
    TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.sizes() == cos.sizes() && cos.is_contiguous() &&
                    sin.is_contiguous() && sin.scalar_type() == at::kFloat && cos.numel() == idx.numel() * r &&
                    r % 2 == 0 && r <= d,
                "cos, sin: contiguous fp32 [Hkv, nq, K, r], r even and at most D");
  at::Tensor out = at::empty({q.size(0), rows, d}, at::kFloat);
#ifdef MSA_AVX512_BF16
  std::vector<PackedKeys> packed(hkv * nq);
  const int32_t* ids = idx.data_ptr<int32_t>();
  const float* cs = rotated ? cos.data_ptr<float>() : nullptr;
  const float* sn = rotated ? sin.data_ptr<float>() : nullptr;
  auto pack = [&](auto element) {  // element: a null pointer of the cache's element type
    using T = std::remove_const_t<std::remove_pointer_t<decltype(element)>>;
    const T* kd = k.data_ptr<T>();
    const T* vd = v.data_ptr<T>();
    at::parallel_for(0, hkv * nq, 1, [&](int64_t first, int64_t last) {
      std::vector<float> scratch;
      for (int64_t b = first; b < last; ++b) {
        const int64_t offset = (b / nq) * k.stride(0), at_slot = b * slots;
        attention_bf16::pack_selected_blocks(kd + offset, vd + offset, d, k.size(1), ids + at_slot, slots, block_size,
                                             rotated ? cs + at_slot * r : nullptr, rotated ? sn + at_slot * r : nullptr,
                                             r, d, scratch, packed[b]);
      }
    });
  };
  switch (k.scalar_type()) {
    case at::kFloat: pack(static_cast<const float*>(nullptr)); break;
    case at::kHalf: pack(static_cast<const at::Half*>(nullptr)); break;
    case at::kBFloat16: pack(static_cast<const at::BFloat16*>(nullptr)); break;
    default: TORCH_CHECK(false, "k, v: fp32, fp16 or bf16");
  }
  attend_batches(reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>()), q_pos.data_ptr<int64_t>(),
                 q_pos.size(0) == 1 ? 0 : rows, q.size(0), rows, d, packed, static_cast<float>(scale),
                 out.data_ptr<float>());
#endif
  return out;
}

}  // namespace

#ifdef MSA_AVX512_BF16
#pragma GCC pop_options
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attention", &attention, py::call_guard<py::gil_scoped_release>());
  m.def("attention_blocks", &attention_blocks, py::call_guard<py::gil_scoped_release>());
  m.def("built_with_bf16", &built_with_bf16);
}
