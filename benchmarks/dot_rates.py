"""How many multiply-adds a core does per second with each of the CPU's dot-product instructions:
the ceiling of a prefill GEMM on that instruction, measured rather than read from a table.

Each instruction runs in 4, 8, 12, 16 and 24 independent chains on one thread, the best kept
(few chains wait on the instruction's latency; on Zen 5 many chains of vpdpbusd ran at half its
rate with 8); the table gives instructions per second and multiply-adds per second (an
instruction's lanes times the products each lane sums):

    python benchmarks/dot_rates.py [--json out.json]

- fp32 FMA (vfmadd231ps, 16 lanes x 1),
- bf16 pairs (vdpbf16ps, AVX-512 BF16: 16 x 2; what oneDNN's bf16 GEMM runs on without AMX),
- int8 quads (vpdpbusd, AVX-512 VNNI: 16 x 4; what llama.cpp's integer dot products run on),
- int16 pairs (vpdpwssd, 16 x 2).

On the 2-core AMD EPYC (Zen 5) of the README, bf16 pairs and int8 quads both issue two a cycle,
so 8-bit products have twice bf16's multiply-adds per second: the ceiling llama.cpp's integer
products have and msa's bf16 tiles do not.
Needs AVX-512 with BF16 and VNNI and a C++ compiler; says so and exits 2 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SOURCE = r"""
#include <torch/extension.h>
#include <immintrin.h>
#include <algorithm>
#include <chrono>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16")

namespace {
// Instructions per second of kind `op` in `chains` independent chains (the accumulators stay in
// registers; too few chains and the loop waits on latency, too many and it spills or stalls).
template <int op, int chains>
double rate(int64_t n) {
  __m512i acc[chains];
  __m512 facc[chains];
  for (int i = 0; i < chains; ++i) {
    acc[i] = _mm512_set1_epi32(i);
    facc[i] = _mm512_set1_ps(static_cast<float>(i));
  }
  const __m512i a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x01010101);
  const __m512 fa = _mm512_set1_ps(1.0f), fb = _mm512_set1_ps(1e-9f);
  const __m512bh ha = (__m512bh)_mm512_set1_epi32(0x3f803f80), hb = ha;
  const int64_t iters = n / chains;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < chains; ++i) {
      if constexpr (op == 0) facc[i] = _mm512_fmadd_ps(fa, fb, facc[i]);
      if constexpr (op == 1) facc[i] = _mm512_dpbf16_ps(facc[i], ha, hb);
      if constexpr (op == 2) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
      if constexpr (op == 3) acc[i] = _mm512_dpwssd_epi32(acc[i], a, b);
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile int sink = 0;  // keeps the chains' results alive
  for (int i = 0; i < chains; ++i)
    sink = sink + _mm512_reduce_add_epi32(acc[i]) + static_cast<int>(_mm512_reduce_add_ps(facc[i]));
  return static_cast<double>(iters * chains) / s;
}

template <int op>
double best_rate(int64_t n) {
  return std::max({rate<op, 4>(n), rate<op, 8>(n), rate<op, 12>(n), rate<op, 16>(n),
                   rate<op, 24>(n)});
}
}  // namespace

// Instructions per second of each kind, the best over 4-24 chains: fp32 FMA, bf16 pairs, int8
// quads, int16 pairs.
std::vector<double> rates(int64_t n) {
  return {best_rate<0>(n), best_rate<1>(n), best_rate<2>(n), best_rate<3>(n)};
}
"""

KINDS = [  # name, instruction, multiply-adds per instruction
    ("fp32 FMA", "vfmadd231ps", 16),
    ("bf16 pairs", "vdpbf16ps", 32),
    ("int8 quads", "vpdpbusd", 64),
    ("int16 pairs", "vpdpwssd", 32),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=200_000_000, help="instructions a run")
    parser.add_argument("--repeats", type=int, default=3, help="the best of this many runs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from msa.kernels.cpu_features import cpu_flags

    needed = {"avx512f", "avx512_bf16", "avx512_vnni"}
    if not needed <= cpu_flags():
        print(f"this CPU lacks {', '.join(sorted(needed - cpu_flags()))}", file=sys.stderr)
        return 2
    from torch.utils.cpp_extension import load_inline

    ext = load_inline(
        "msa_dot_rates",
        cpp_sources=SOURCE,
        functions=["rates"],
        extra_cflags=["-O2", "-march=native"],
    )
    best = [0.0] * len(KINDS)
    for _ in range(args.repeats):
        best = [max(b, r) for b, r in zip(best, ext.rates(args.iters))]
    rows = []
    print(f"{'kind':<12} {'instruction':<12} {'G instr/s':>10} {'G mul-add/s':>12} {'vs bf16':>8}")
    for (name, instruction, macs), rate in zip(KINDS, best):
        row = {
            "kind": name,
            "instruction": instruction,
            "g_instr_s": round(rate / 1e9, 2),
            "g_macs_s": round(rate * macs / 1e9, 1),
        }
        rows.append(row)
    for row in rows:
        row["vs_bf16"] = round(row["g_macs_s"] / rows[1]["g_macs_s"], 2)
        print(
            f"{row['kind']:<12} {row['instruction']:<12} {row['g_instr_s']:>10} "
            f"{row['g_macs_s']:>12} {row['vs_bf16']:>7}x"
        )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
