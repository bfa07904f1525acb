// The dispatch surface: level names parse and print, unsupported levels are refused with an input
// error (never run into SIGILL), and the description says what runs.
#include "kernels/cpu/optim/simd_level.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"

namespace slidedp::kernels {
namespace {

TEST(SimdLevel, ParseAndName) {
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    EXPECT_EQ(parse_simd_level(simd_level_name(l), "test"), l);
  }
  EXPECT_THROW(parse_simd_level("sse4", "SLIDEDP_SIMD"), InputError);
  EXPECT_THROW(parse_simd_level("", "SLIDEDP_SIMD"), InputError);
}

TEST(SimdLevel, SetAndDescribe) {
  EXPECT_TRUE(simd_level_supported(SimdLevel::kScalar));
  set_simd_level(SimdLevel::kScalar);
  EXPECT_EQ(simd_level(), SimdLevel::kScalar);
  EXPECT_EQ(simd_description(), "scalar");
  for (SimdLevel l : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (simd_level_supported(l)) {
      set_simd_level(l, false);
      EXPECT_EQ(simd_level(), l);
      EXPECT_FALSE(simd_uses_avx512_bf16());
    } else {
      EXPECT_THROW(set_simd_level(l), InputError);
    }
  }
  if (cpu_simd_support().avx512_bf16) {
    set_simd_level(SimdLevel::kAvx512, true);
    EXPECT_EQ(simd_description(), "avx512+bf16");
  }
  set_simd_level(best_simd_level());
  EXPECT_EQ(simd_level(), best_simd_level());
}

// SLIDEDP_SIMD is read once per process, so each case runs in a fresh child process ("threadsafe"
// death tests re-execute the binary) where the level has not been resolved yet.
TEST(SimdLevelDeathTest, EnvironmentForcesOrRejects) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("SLIDEDP_SIMD", "scalar", 1);
        std::exit(simd_level() == SimdLevel::kScalar ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv("SLIDEDP_SIMD", "sse4", 1);
        try {
          simd_level();
        } catch (const InputError&) {
          std::exit(3);
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace slidedp::kernels
