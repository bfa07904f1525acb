// Runtime SIMD dispatch for the CPU optimizer kernels (faiss-style): every kernel exists at each
// level, the best level this CPU and OS support is chosen at first use, and SLIDEDP_SIMD (or
// set_simd_level, for tests and benchmarks) forces one. All levels execute the same sequence of
// correctly rounded IEEE operations per element, so they produce bit-identical results.
#pragma once

#include <string>
#include <string_view>

namespace slidedp::kernels {

enum class SimdLevel {
  kScalar = 0,  // plain C++, built without auto-vectorization: the reference
  kAvx2 = 1,    // AVX2 + FMA, 8 fp32 lanes
  kAvx512 = 2,  // AVX-512 F/BW/VL/DQ, 16 fp32 lanes; AVX512-BF16 conversions where the CPU has them
};

// What this CPU (CPUID) and OS (XCR0: saved vector state) can run.
struct CpuSimdSupport {
  bool avx2_fma = false;
  bool avx512 = false;       // F + BW + VL + DQ with ZMM state enabled by the OS
  bool avx512_bf16 = false;  // AVX512_BF16 (vcvtne2ps2bf16) on top of avx512
};
const CpuSimdSupport& cpu_simd_support();

bool simd_level_supported(SimdLevel level);
SimdLevel best_simd_level();

// The level kernels use now. Resolved on first use: SLIDEDP_SIMD=scalar|avx2|avx512 if set (a level
// this CPU lacks falls back to the best supported one below it, with one warning on stderr; any
// other value throws InputError naming SLIDEDP_SIMD), else best_simd_level().
SimdLevel simd_level();
// Whether the active level converts fp32 -> bf16 with AVX512-BF16 instructions.
bool simd_uses_avx512_bf16();

// Forces a level for the whole process (tests, benchmarks). allow_avx512_bf16 = false keeps the
// AVX-512 level on its integer-rounding conversion even where AVX512-BF16 exists, so both paths
// can be tested on one machine. Throws InputError if this CPU cannot run the level.
// Not meant to race with kernel calls: a call already running finishes on the level it started.
void set_simd_level(SimdLevel level, bool allow_avx512_bf16 = true);

const char* simd_level_name(SimdLevel level);  // "scalar", "avx2", "avx512"
// Parses "scalar" | "avx2" | "avx512"; throws InputError naming `where` otherwise.
SimdLevel parse_simd_level(std::string_view text, const std::string& where);
// The active level as reported in benchmark rows, e.g. "avx512+bf16", "avx2", "scalar".
std::string simd_description();

}  // namespace slidedp::kernels
