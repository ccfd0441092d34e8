// The kernels of a question's scan over a document's keys (msa.models.question_peaks), one
// extension: keys rotated back to position 0 in one pass (rotate_back.h, every CPU), the
// screen's block maxima of bf16 products (block_maxima_bf16.h, CPUs with AVX-512 BF16), and the
// exact pass's block maxima and softmax sums of fp32 logits (exact_peaks.h, AVX-512).
#include <torch/extension.h>

#include "rotate_back.h"
#include "block_maxima_bf16.h"
#include "exact_peaks.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rotate_back", &question_scan::rotate_back, py::call_guard<py::gil_scoped_release>());
  m.def("block_maxima", &question_scan::block_maxima, py::call_guard<py::gil_scoped_release>());
  m.def("built_with_bf16", &question_scan::built_with_bf16);
  m.def("exact_peaks", &question_scan::exact_peaks, py::call_guard<py::gil_scoped_release>());
  m.def("built_with_avx512", &question_scan::built_with_avx512);
}
