// MSA's block index on the CPU (kernels/index_scores.py): the stored 4-bit index scored by a
// step's or a chunk's queries (index_logits.h).
#include <torch/extension.h>

#include "index_logits.h"

namespace {

// q fp32 [Hq, T, D] contiguous; codes uint8 [Hkv, cap, D / 2], scales fp16 [Hkv, cap], means
// fp16 [Hkv, cap / B, D], all contiguous; the first n_tokens (whole blocks) scored. Returns
// fp32 [Hq, T, n_tokens]: q . k~ (unscaled) for every query against every indexed token.
at::Tensor index_logits(at::Tensor q, at::Tensor codes, at::Tensor scales, at::Tensor means, int64_t n_tokens,
                        int64_t block_size) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "q must be contiguous fp32 [Hq, T, D]");
  const int64_t n_heads = q.size(0), n_queries = q.size(1), d = q.size(2);
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.size(2) * 2 == d,
              "codes must be contiguous uint8 [Hkv, cap, D / 2]");
  const int64_t n_kv_heads = codes.size(0), cap = codes.size(1);
  TORCH_CHECK(n_heads % n_kv_heads == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.size(0) == n_kv_heads &&
                  scales.size(1) == cap,
              "scales must be contiguous fp16 [Hkv, cap]");
  TORCH_CHECK(means.scalar_type() == at::kHalf && means.is_contiguous() && means.size(0) == n_kv_heads &&
                  means.size(2) == d && means.size(1) * block_size >= n_tokens,
              "means must be contiguous fp16 [Hkv, >= n_tokens / B, D]");
  TORCH_CHECK(block_size > 0 && n_tokens % block_size == 0 && n_tokens <= cap, "n_tokens: whole blocks of the index");
  at::Tensor out = at::empty({n_heads, n_queries, n_tokens}, q.options());
  const block_index::IndexView view{codes.data_ptr<uint8_t>(), scales.data_ptr<c10::Half>(),
                                    means.data_ptr<c10::Half>(), cap, means.size(1), n_tokens, block_size};
  // one query position at a time: its heads as rows [Hq, D] (strided T * D apart in q)
  std::vector<float> rows(static_cast<size_t>(n_heads * d));
  const float* qp = q.data_ptr<float>();
  for (int64_t t = 0; t < n_queries; ++t) {
    for (int64_t h = 0; h < n_heads; ++h)
      std::copy(qp + (h * n_queries + t) * d, qp + (h * n_queries + t + 1) * d, rows.begin() + h * d);
    block_index::index_logits(rows.data(), n_heads, n_kv_heads, d, view, out.data_ptr<float>() + t * n_tokens,
                              n_queries * n_tokens);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("index_logits", &index_logits, py::call_guard<py::gil_scoped_release>());
}
