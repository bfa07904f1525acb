// CPU feature detection (CPUID + XGETBV, as the Intel SDM prescribes: a feature is usable only if
// the OS saves its register state) and the process-wide active kernel table. The table pointer is an
// atomic, so kernel calls never take a lock: they load it once per call.
#include "kernels/cpu/optim/simd_level.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "common/error.h"
#include "kernels/cpu/optim/kernel_table.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define SLIDEDP_OPTIM_X86 1
#else
#define SLIDEDP_OPTIM_X86 0
#endif

namespace slidedp::kernels {
namespace {

CpuSimdSupport detect() {
  CpuSimdSupport s;
#if SLIDEDP_OPTIM_X86
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return s;
  const bool osxsave = (ecx >> 27) & 1u;
  const bool avx = (ecx >> 28) & 1u;
  const bool fma = (ecx >> 12) & 1u;
  if (!osxsave || !avx) return s;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool os_ymm = (xcr0_lo & 0x6u) == 0x6u;    // SSE + AVX state
  const bool os_zmm = (xcr0_lo & 0xe6u) == 0xe6u;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (__get_cpuid_max(0, nullptr) < 7) return s;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool avx2 = (ebx >> 5) & 1u;
  const bool avx512f = (ebx >> 16) & 1u;
  const bool avx512dq = (ebx >> 17) & 1u;
  const bool avx512bw = (ebx >> 30) & 1u;
  const bool avx512vl = (ebx >> 31) & 1u;
  const unsigned max_subleaf = eax;
  bool avx512_bf16 = false;
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    avx512_bf16 = (eax >> 5) & 1u;
  }
  s.avx2_fma = SLIDEDP_OPTIM_HAVE_AVX2 && os_ymm && avx2 && fma;
  s.avx512 = SLIDEDP_OPTIM_HAVE_AVX512 && s.avx2_fma && os_zmm && avx512f && avx512dq && avx512bw && avx512vl;
  s.avx512_bf16 = SLIDEDP_OPTIM_HAVE_AVX512_BF16 && s.avx512 && avx512_bf16;
#endif
  return s;
}

// The table compiled for a level, or nullptr when this build has none (non-x86, old compiler).
// Taking a table's address runs no SIMD instruction, so this is safe on any CPU.
const detail::KernelTable* table_for(SimdLevel level, bool use_bf16) {
  switch (level) {
    case SimdLevel::kScalar:
      return &detail::scalar_kernel_table();
    case SimdLevel::kAvx2:
#if SLIDEDP_OPTIM_HAVE_AVX2
      return &detail::avx2_kernel_table();
#else
      return nullptr;
#endif
    case SimdLevel::kAvx512:
#if SLIDEDP_OPTIM_HAVE_AVX512_BF16
      if (use_bf16) return &detail::avx512_bf16_kernel_table();
#endif
#if SLIDEDP_OPTIM_HAVE_AVX512
      if (!use_bf16) return &detail::avx512_kernel_table();
#endif
      return nullptr;
  }
  return nullptr;
}

// What kernel calls read: one immutable record per choice, so switching levels swaps one pointer
// and a call already running keeps a valid record.
struct Active {
  SimdLevel level;
  bool bf16;
  const detail::KernelTable* table;
};

std::atomic<const Active*> g_active{nullptr};
std::once_flag g_env_once;

// Requires simd_level_supported(level).
const Active* make_active(SimdLevel level, bool allow_bf16) {
  static const Active records[4] = {
      {SimdLevel::kScalar, false, table_for(SimdLevel::kScalar, false)},
      {SimdLevel::kAvx2, false, table_for(SimdLevel::kAvx2, false)},
      {SimdLevel::kAvx512, false, table_for(SimdLevel::kAvx512, false)},
      {SimdLevel::kAvx512, true, table_for(SimdLevel::kAvx512, true)},
  };
  const bool bf16 = level == SimdLevel::kAvx512 && allow_bf16 && cpu_simd_support().avx512_bf16;
  const Active* a = &records[bf16 ? 3 : static_cast<int>(level)];
  SLIDEDP_CHECK(a->table != nullptr, "SIMD level reported supported but not built");
  return a;
}

void resolve_from_env() {
  SimdLevel level = best_simd_level();
  if (const char* env = std::getenv("SLIDEDP_SIMD"); env != nullptr && env[0] != '\0') {
    const SimdLevel wanted = parse_simd_level(env, "SLIDEDP_SIMD");
    if (simd_level_supported(wanted)) {
      level = wanted;
    } else {
      // Forcing a level this CPU lacks would crash with SIGILL; fall back and say so once.
      while (!simd_level_supported(level) || static_cast<int>(level) > static_cast<int>(wanted)) {
        level = static_cast<SimdLevel>(static_cast<int>(level) - 1);
      }
      std::fprintf(stderr, "slidedp: SLIDEDP_SIMD=%s is not supported by this CPU; using %s\n", env,
                   simd_level_name(level));
    }
  }
  const Active* expected = nullptr;
  // set_simd_level may have run first; it wins.
  g_active.compare_exchange_strong(expected, make_active(level, true));
}

const Active& active() {
  const Active* a = g_active.load(std::memory_order_acquire);
  if (a != nullptr) return *a;
  std::call_once(g_env_once, resolve_from_env);
  return *g_active.load(std::memory_order_acquire);
}

}  // namespace

const CpuSimdSupport& cpu_simd_support() {
  static const CpuSimdSupport s = detect();
  return s;
}

bool simd_level_supported(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return true;
    case SimdLevel::kAvx2:
      return cpu_simd_support().avx2_fma;
    case SimdLevel::kAvx512:
      return cpu_simd_support().avx512;
  }
  return false;
}

SimdLevel best_simd_level() {
  if (simd_level_supported(SimdLevel::kAvx512)) return SimdLevel::kAvx512;
  if (simd_level_supported(SimdLevel::kAvx2)) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

SimdLevel simd_level() { return active().level; }

bool simd_uses_avx512_bf16() { return active().bf16; }

void set_simd_level(SimdLevel level, bool allow_avx512_bf16) {
  if (!simd_level_supported(level)) {
    throw InputError("set_simd_level", std::string("SIMD level ") + simd_level_name(level) +
                                           " is not supported by this CPU or build");
  }
  g_active.store(make_active(level, allow_avx512_bf16), std::memory_order_release);
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

SimdLevel parse_simd_level(std::string_view text, const std::string& where) {
  if (text == "scalar") return SimdLevel::kScalar;
  if (text == "avx2") return SimdLevel::kAvx2;
  if (text == "avx512") return SimdLevel::kAvx512;
  throw InputError(where, "expected scalar, avx2 or avx512, got '" + std::string(text) + "'");
}

std::string simd_description() {
  const Active& a = active();
  return std::string(simd_level_name(a.level)) + (a.bf16 ? "+bf16" : "");
}

namespace detail {
const KernelTable& active_kernel_table() { return *active().table; }
}  // namespace detail

}  // namespace slidedp::kernels
