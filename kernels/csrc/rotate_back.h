// Keys rotated back by RoPE's rotate-half, widened to fp32, in one pass: what a question's scan
// does to every key of a document (msa.models.question_peaks). `rotate_back_reference` in
// msa.kernels.rotary is the definition in plain PyTorch this kernel is tested against.
// Included by question_scan.cpp, after torch/extension.h.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "widen_row.h"

namespace question_scan {

// The angles of one row: cos, sin [half] as given, or, with a first angle (cf, sf), the sums
// first + given (cos(a + b) = cos a cos b - sin a sin b, sin(a + b) = sin a cos b + cos a sin b).
struct Angles {
  const float* cos;
  const float* sin;
  int64_t row_stride;
  const float* cos_first;  // null: the angles as given
  const float* sin_first;
};

// Row t of x (heads strided by head_stride, rows of d channels one after another), rotated
// backwards by its angles: channel i < half pairs with i + half, as x * cos - rotate_half(x) *
// sin computes it; channels from 2 * half on pass through.
template <typename T>
inline void rotate_rows(const T* x, int64_t heads, int64_t head_stride, int64_t rows, int64_t d, const Angles& a,
                        int64_t half, float* out) {
  at::parallel_for(0, rows, 128, [&](int64_t first, int64_t last) {
    std::vector<float> row(d), sums(2 * half);
    for (int64_t t = first; t < last; ++t) {
      const float* __restrict c = a.cos + t * a.row_stride;
      const float* __restrict s = a.sin + t * a.row_stride;
      if (a.cos_first != nullptr) {  // the row's angles, once for every head
        const float* __restrict cf = a.cos_first;
        const float* __restrict sf = a.sin_first;
        float* __restrict c_sum = sums.data();
        float* __restrict s_sum = sums.data() + half;
        for (int64_t i = 0; i < half; ++i) {
          c_sum[i] = cf[i] * c[i] - sf[i] * s[i];
          s_sum[i] = sf[i] * c[i] + cf[i] * s[i];
        }
        c = c_sum;
        s = s_sum;
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* __restrict o = out + (h * rows + t) * d;
        const float* __restrict in = row.data();
        cache_rows::widen(x + h * head_stride + t * d, d, row.data());
        for (int64_t i = 0; i < half; ++i) o[i] = in[i] * c[i] + in[i + half] * s[i];
        for (int64_t i = 0; i < half; ++i) o[i + half] = in[i + half] * c[i] - in[i] * s[i];
        for (int64_t i = 2 * half; i < d; ++i) o[i] = in[i];
      }
    }
  });
}

inline void check_angles(const at::Tensor& cos, const at::Tensor& sin, int64_t rows, int64_t half, const char* what) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.dim() == 2 &&
                  sin.sizes() == cos.sizes() && sin.strides() == cos.strides() && cos.stride(1) == 1 &&
                  cos.size(0) == rows && cos.size(1) == half,
              what);
}

// x [H, T, D] (fp32, fp16 or bf16; rows contiguous, heads at any stride); cos, sin fp32
// [T, R / 2] (R even, at most D; each row's channels contiguous, rows at any stride); cos_first,
// sin_first fp32 [1, R / 2], or empty: each row's angles are the first plus its own. Returns
// fp32 [H, T, D].
inline at::Tensor rotate_back(at::Tensor x, at::Tensor cos, at::Tensor sin, at::Tensor cos_first, at::Tensor sin_first) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2), "x: [H, T, D], rows contiguous");
  const int64_t heads = x.size(0), rows = x.size(1), d = x.size(2), half = cos.dim() == 2 ? cos.size(1) : 0;
  TORCH_CHECK(2 * half <= d, "cos, sin: [T, R / 2] with R at most D");
  check_angles(cos, sin, rows, half, "cos, sin: fp32 [T, R / 2], each row's channels contiguous");
  const bool summed = cos_first.numel() > 0;
  if (summed) check_angles(cos_first, sin_first, 1, half, "cos_first, sin_first: fp32 [1, R / 2]");
  const Angles angles{cos.data_ptr<float>(), sin.data_ptr<float>(), cos.stride(0),
                      summed ? cos_first.data_ptr<float>() : nullptr, summed ? sin_first.data_ptr<float>() : nullptr};
  at::Tensor out = at::empty({heads, rows, d}, x.options().dtype(at::kFloat));
  auto run = [&](auto element) {  // element: a null pointer of x's element type
    using T = std::remove_const_t<std::remove_pointer_t<decltype(element)>>;
    rotate_rows(x.data_ptr<T>(), heads, x.stride(0), rows, d, angles, half, out.data_ptr<float>());
  };
  switch (x.scalar_type()) {
    case at::kFloat: run(static_cast<const float*>(nullptr)); break;
    case at::kHalf: run(static_cast<const at::Half*>(nullptr)); break;
    case at::kBFloat16: run(static_cast<const at::BFloat16*>(nullptr)); break;
    default: TORCH_CHECK(false, "x: fp32, fp16 or bf16");
  }
  return out;
}

}  // namespace question_scan
