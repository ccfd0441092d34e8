// The GGUF block types the kernels of ggml_blocks.h read: GGML type values, block sizes, the
// fp16 scales.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <vector>
#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace ggml_blocks {

// GGMLQuantizationType values
enum Type : int64_t { Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14 };

inline bool supported(int64_t type) { return type == Q5_0 || type == Q8_0 || type == Q4_K || type == Q6_K; }
// The K-quants: blocks of 256 values, and a matvec's input quantized as Q8_K (Q8_0 for the others).
inline bool k_quant(int64_t type) { return type == Q4_K || type == Q6_K; }
inline int64_t block_values(int64_t type) { return k_quant(type) ? 256 : 32; }
inline int64_t block_bytes(int64_t type) {
  switch (type) {
    case Q5_0: return 22;
    case Q8_0: return 34;
    case Q4_K: return 144;
    default: return 210;  // Q6_K
  }
}
// Bytes of a row of k weights (k a multiple of block_values).
inline int64_t bytes_per_row(int64_t type, int64_t k) { return k / block_values(type) * block_bytes(type); }
inline int64_t group_size(int64_t type) { return type == Q6_K ? 16 : 32; }

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#ifdef __F16C__
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

}  // namespace ggml_blocks
