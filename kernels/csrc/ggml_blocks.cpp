// Per-op kernels over a GGUF's own blocks (ggml_blocks.h): the products of a linear layer whose
// weights stay in the file's Q4_K / Q6_K / Q5_0 / Q8_0 blocks. See msa.kernels.ggml_blocks.
#include <torch/extension.h>

#include "ggml_blocks.h"
#include "ggml_blocks_bf16.h"
#include "ggml_gemm_int8.h"

namespace {

// The weight's rows: blocks uint8 [R, row_bytes] (a view of the mapped file), optional row ids
// int64 [N] (an output row's row in `blocks`: llama.cpp's q/k row order undone without a copy).
struct Rows {
  const uint8_t* base;
  int64_t row_bytes, n, k, type;
  const int64_t* ids;

  // These rows as a part of a matvec or of linear_int8_parts, writing to y.
  ggml_blocks::MatvecPart part(float* y) const { return {type, base, row_bytes, ids, n, y}; }
};

Rows rows_of(const at::Tensor& blocks, int64_t type, const at::Tensor& row_ids, int64_t k) {
  TORCH_CHECK(ggml_blocks::supported(type), "ggml type ", type, " has no kernel");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous(),
              "blocks must be contiguous uint8 [rows, bytes per row]");
  TORCH_CHECK(k % ggml_blocks::block_values(type) == 0, "the input width must be whole blocks");
  const int64_t row_bytes = ggml_blocks::bytes_per_row(type, k);
  TORCH_CHECK(blocks.size(1) == row_bytes, "blocks hold ", blocks.size(1), " bytes a row, not ", row_bytes);
  int64_t n = blocks.size(0);
  const int64_t* ids = nullptr;
  if (row_ids.numel() > 0) {
    TORCH_CHECK(row_ids.scalar_type() == at::kLong && row_ids.is_contiguous(), "row ids must be int64");
    ids = row_ids.data_ptr<int64_t>();
    n = row_ids.numel();
  }
  return {blocks.data_ptr<uint8_t>(), row_bytes, n, k, type, ids};
}

// fp32 [last - first, k]: rows first..last-1 of the weight.
at::Tensor dequantize(at::Tensor blocks, int64_t type, at::Tensor row_ids, int64_t k, int64_t first, int64_t last) {
  const Rows w = rows_of(blocks, type, row_ids, k);
  TORCH_CHECK(0 <= first && first <= last && last <= w.n, "rows out of range");
  at::Tensor out = at::empty({last - first, k}, at::kFloat);
  const int64_t* ids = w.ids ? w.ids + first : nullptr;
  const uint8_t* base = ids ? w.base : w.base + first * w.row_bytes;
  ggml_blocks::dequantize_rows(type, base, w.row_bytes, ids, last - first, k, out.data_ptr<float>());
  return out;
}

// x [k] fp32 -> the matrices' products with x side by side [sum of their rows], as one matvec
// (ggml_blocks::matvec_parts: the fused decode step's q/k/v and gate/up).
at::Tensor matvec_parts(at::Tensor x, std::vector<at::Tensor> blocks, std::vector<int64_t> types,
                        std::vector<at::Tensor> row_ids) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 1 && x.is_contiguous(), "x must be fp32 [K]");
  TORCH_CHECK(!blocks.empty() && blocks.size() == types.size() && blocks.size() == row_ids.size(),
              "one type and one row id list per matrix");
  std::vector<Rows> matrices;
  int64_t total = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    matrices.push_back(rows_of(blocks[i], types[i], row_ids[i], x.size(0)));
    total += matrices.back().n;
  }
  at::Tensor y = at::empty({total}, at::kFloat);
  std::vector<ggml_blocks::MatvecPart> parts;
  float* out = y.data_ptr<float>();
  for (const Rows& w : matrices) {
    parts.push_back(w.part(out));
    out += w.n;
  }
  ggml_blocks::matvec_parts(parts.data(), static_cast<int64_t>(parts.size()), x.size(0), x.data_ptr<float>());
  return y;
}

// Rows of W per dequantized tile of the many-row products: about 4M values (16 MB in fp32, 8 in
// bf16), at least 64.
int64_t tile_rows(int64_t k) { return std::max<int64_t>(64, (int64_t{1} << 22) / k); }

// x [M, k] fp32 -> x W^T [M, N] fp32: a matvec for one row (x quantized to int8, or in fp32
// where `exact`), else row tiles of W dequantized to fp32 (about 16 MB each: smaller ones made
// the GEMMs several times slower, measured) and multiplied by a GEMM.
at::Tensor linear(at::Tensor x, at::Tensor blocks, int64_t type, at::Tensor row_ids, bool exact) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x must be fp32 [M, K]");
  const Rows w = rows_of(blocks, type, row_ids, x.size(1));
  const int64_t m = x.size(0);
  if (m <= 1) {
    at::Tensor y = at::empty({m, w.n}, at::kFloat);
    if (m == 1)
      (exact ? ggml_blocks::matvec_fp32 : ggml_blocks::matvec)(type, w.base, w.row_bytes, w.ids, w.n, w.k,
                                                               x.data_ptr<float>(), y.data_ptr<float>());
    return y;
  }
  at::Tensor yt = at::empty({w.n, m}, at::kFloat);  // rows of W by rows: tiles write whole rows
  const int64_t tile = tile_rows(w.k);
  const at::Tensor xt = x.t().contiguous();
  for (int64_t first = 0; first < w.n; first += tile) {
    const int64_t last = std::min(w.n, first + tile);
    at::Tensor out = yt.narrow(0, first, last - first);
    at::mm_out(out, dequantize(blocks, type, row_ids, w.k, first, last), xt);
  }
  return yt.t().contiguous();
}

// bf16 [last - first, k]: rows first..last-1 of the weight, each value rounded to bf16.
at::Tensor dequantize_bf16(at::Tensor blocks, int64_t type, at::Tensor row_ids, int64_t k, int64_t first,
                           int64_t last) {
  const Rows w = rows_of(blocks, type, row_ids, k);
  TORCH_CHECK(0 <= first && first <= last && last <= w.n, "rows out of range");
  at::Tensor out = at::empty({last - first, k}, at::kBFloat16);
  const int64_t* ids = w.ids ? w.ids + first : nullptr;
  const uint8_t* base = ids ? w.base : w.base + first * w.row_bytes;
  ggml_blocks::dequantize_rows_bf16(type, base, w.row_bytes, ids, last - first, k,
                                    reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()));
  return out;
}

// Whether this CPU runs linear_bf16 on bf16 matrix units (oneDNN packs for AMX there); else it
// takes bf16 tiles and PyTorch's bf16 GEMM (linear_bf16_gemm).
bool bf16_matrix_units() { return at::native::cpublas::could_pack(at::kBFloat16); }

// y [m, n] fp32 = x W^T without matrix units: tiles of W's rows dequantized to bf16 (tile_rows),
// each multiplied by PyTorch's bf16 GEMM (oneDNN's on AVX-512 BF16 instructions: 4-4.5x
// its fp32 GEMM on an AMD EPYC, measured), which sums in fp32 and rounds its output to bf16.
void linear_bf16_gemm(const at::Tensor& blocks, int64_t type, const at::Tensor& row_ids, const Rows& w,
                      const at::Tensor& xb, at::Tensor& y) {
  const int64_t tile = tile_rows(w.k);
  for (int64_t first = 0; first < w.n; first += tile) {
    const int64_t last = std::min(w.n, first + tile);
    y.narrow(1, first, last - first).copy_(at::mm(xb, dequantize_bf16(blocks, type, row_ids, w.k, first, last).t()));
  }
}

// x [M, k] fp32 -> x W^T [M, N] fp32 from W's rows rounded to bf16 and x rounded to bf16, the
// products summed in fp32: on matrix units with fp32 output (ggml_blocks_bf16.h), elsewhere
// rounded to bf16 at the output (linear_bf16_gemm).
at::Tensor linear_bf16(at::Tensor x, at::Tensor blocks, int64_t type, at::Tensor row_ids) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "x must be fp32 [M, K]");
  const Rows w = rows_of(blocks, type, row_ids, x.size(1));
  const at::Tensor xb = x.to(at::kBFloat16).contiguous();
  at::Tensor y = at::empty({x.size(0), w.n}, at::kFloat);
  if (x.size(0) == 0 || w.n == 0) return y;
  if (bf16_matrix_units())
    ggml_blocks::linear_bf16_tiles(type, w.base, w.row_bytes, w.ids, w.n, w.k, xb.data_ptr<at::BFloat16>(), x.size(0),
                                   y.data_ptr<float>());
  else
    linear_bf16_gemm(blocks, type, row_ids, w, xb, y);
  return y;
}

// x [M, k] fp32 -> each matrix's x W^T [M, N_i] fp32 with each row of x in int8, as one row's
// matvec computes it (ggml_gemm_int8.h): x quantized once a format, one parallel region.
std::vector<at::Tensor> linear_int8_parts(at::Tensor x, std::vector<at::Tensor> blocks, std::vector<int64_t> types,
                                          std::vector<at::Tensor> row_ids) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x must be fp32 [M, K]");
  TORCH_CHECK(!blocks.empty() && blocks.size() == types.size() && blocks.size() == row_ids.size(),
              "one type and one row id list per matrix");
  std::vector<at::Tensor> ys;
  std::vector<ggml_blocks::MatvecPart> parts;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Rows w = rows_of(blocks[i], types[i], row_ids[i], x.size(1));
    ys.push_back(at::empty({x.size(0), w.n}, at::kFloat));
    if (w.n > 0) parts.push_back(w.part(ys.back().data_ptr<float>()));
  }
  if (x.size(0) > 0 && !parts.empty())
    ggml_blocks::linear_int8_parts(parts.data(), static_cast<int64_t>(parts.size()), x.size(1), x.data_ptr<float>(),
                                   x.size(0));
  return ys;
}

// Whether linear_int8 runs on its AVX-512 VNNI GEMM here (else row by row, as matvec).
bool int8_gemm() {
#ifdef MSA_GEMM_INT8
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dequantize", &dequantize, py::call_guard<py::gil_scoped_release>());
  m.def("linear", &linear, py::call_guard<py::gil_scoped_release>());
  m.def("matvec_parts", &matvec_parts, py::call_guard<py::gil_scoped_release>());
  m.def("dequantize_bf16", &dequantize_bf16, py::call_guard<py::gil_scoped_release>());
  m.def("linear_bf16", &linear_bf16, py::call_guard<py::gil_scoped_release>());
  m.def("bf16_matrix_units", &bf16_matrix_units);
  m.def("linear_int8_parts", &linear_int8_parts, py::call_guard<py::gil_scoped_release>());
  m.def("int8_gemm", &int8_gemm);
}
