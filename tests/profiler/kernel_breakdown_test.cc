// sum_kernels against hand-made spans as executor/kernel_activity.h writes them: kernel spans of the
// asked device summed by kernel with the phase prefix dropped, largest first; other devices, the
// CUDA-event spans (category "compute") and host spans ignored.
#include "profiler/kernel_breakdown.h"

#include <gtest/gtest.h>

namespace slidedp::profiler {
namespace {

exec::MeasuredSpan span(int rank, const char* category, const char* what, double start, double end) {
  exec::MeasuredSpan s;
  s.rank = rank;
  s.stream = "compute.kernels";
  s.tag.category = category;
  s.tag.what = what;
  s.start_s = start;
  s.end_s = end;
  return s;
}

TEST(KernelBreakdown, SumsTheDevicesKernelSpansByKernelLargestFirst) {
  const std::vector<exec::MeasuredSpan> spans = {
      span(0, "compute", "fwd", 0.0, 1.0),                               // the CUDA-event span: not a kernel
      span(0, "kernel", "fwd: rmsnorm_forward_kernel", 0.00, 0.01),
      span(0, "kernel", "fwd: attention_forward_tc_kernel<64>", 0.02, 0.52),
      span(0, "kernel", "fwd: rmsnorm_forward_kernel", 0.60, 0.62),
      span(0, "kernel", "memcpy DtoD", 0.70, 0.71),                      // outside any span: no prefix
      span(1, "kernel", "fwd: rmsnorm_forward_kernel", 0.0, 5.0),        // another device
      span(-1, "kernel", "host: something", 0.0, 5.0),                   // the host
  };
  const std::vector<KernelTotal> k = sum_kernels(spans, 0);
  ASSERT_EQ(k.size(), 3u);
  EXPECT_EQ(k[0].kernel, "attention_forward_tc_kernel<64>");
  EXPECT_EQ(k[0].calls, 1);
  EXPECT_NEAR(k[0].seconds, 0.5, 1e-12);
  EXPECT_EQ(k[1].kernel, "rmsnorm_forward_kernel");
  EXPECT_EQ(k[1].calls, 2);
  EXPECT_NEAR(k[1].seconds, 0.03, 1e-12);
  EXPECT_EQ(k[2].kernel, "memcpy DtoD");
  EXPECT_NEAR(k[2].seconds, 0.01, 1e-12);
  EXPECT_TRUE(sum_kernels(spans, 2).empty());
}

}  // namespace
}  // namespace slidedp::profiler
