// Kernel activity on the measured timeline (executor/kernel_activity.h), from hand-made records as
// CUPTI gives them: the clock conversion, the attribution of each kernel to the CUDA-event span of
// its rank and stream that contains it (never to another stream's or rank's span), the activities on
// streams that are not the executor's counted and dropped, and the names interned for SpanTag.
#include "executor/kernel_activity.h"

#include <gtest/gtest.h>

namespace slidedp::exec {
namespace {

MeasuredSpan measured(int rank, const char* stream, const char* what, int unit, int step, double start, double end) {
  MeasuredSpan m;
  m.rank = rank;
  m.stream = stream;
  m.tag.category = "compute";
  m.tag.what = what;
  m.tag.unit = unit;
  m.tag.step = step;
  m.start_s = start;
  m.end_s = end;
  return m;
}

DeviceActivity kernel(const char* name, uint32_t device, uint32_t stream, uint64_t start_ns, uint64_t end_ns) {
  DeviceActivity a;
  a.name = name;
  a.device = device;
  a.stream = stream;
  a.start_ns = start_ns;
  a.end_ns = end_ns;
  return a;
}

TEST(KernelActivity, KernelsLandInTheirStreamsSpansOnTheTraceClock) {
  // CUPTI's clock reads 5e9 ns when the trace clock reads 2.0 s
  const ActivityClock clock{5'000'000'000, 2.0};
  const std::vector<ActivityStream> streams = {{0, 7, 0, "compute"}, {0, 9, 0, "comm"}, {1, 7, 1, "compute"}};
  const std::vector<MeasuredSpan> spans = {
      measured(0, "compute", "fwd", 3, 0, 2.000, 2.010),
      measured(0, "compute", "bwd", 3, 0, 2.020, 2.030),
      measured(1, "compute", "bwd", 4, 0, 2.000, 2.030),
  };
  const std::vector<DeviceActivity> acts = {
      kernel("gemm", 0, 7, 5'001'000'000, 5'004'000'000),     // 2.001-2.004 s: rank 0's fwd of unit 3
      kernel("rmsnorm", 0, 7, 5'021'000'000, 5'022'000'000),  // rank 0's bwd of unit 3
      kernel("gemm", 1, 7, 5'021'000'000, 5'022'000'000),     // the same time on rank 1: its bwd of unit 4
      kernel("nccl", 0, 9, 5'012'000'000, 5'013'000'000),     // comm stream: no measured span there
      kernel("other", 0, 42, 5'000'000'000, 5'001'000'000),   // not an executor stream
      kernel("gap", 0, 7, 5'014'000'000, 5'015'000'000),      // compute, between fwd and bwd
  };
  std::set<std::string> names;
  const AttributedActivities r = attribute_activities(acts, streams, clock, spans, names);
  ASSERT_EQ(r.spans.size(), 5u);
  EXPECT_EQ(r.unknown_stream, 1);
  EXPECT_EQ(r.outside_spans, 2);
  const MeasuredSpan& g = r.spans[0];
  EXPECT_EQ(g.rank, 0);
  EXPECT_EQ(g.stream, "compute.kernels");
  EXPECT_STREQ(g.tag.category, "kernel");
  EXPECT_STREQ(g.tag.what, "fwd: gemm");
  EXPECT_EQ(g.tag.unit, 3);
  EXPECT_NEAR(g.start_s, 2.001, 1e-12);
  EXPECT_NEAR(g.end_s, 2.004, 1e-12);
  EXPECT_STREQ(r.spans[1].tag.what, "bwd: rmsnorm");
  EXPECT_EQ(r.spans[1].tag.unit, 3);
  EXPECT_EQ(r.spans[2].rank, 1);
  EXPECT_EQ(r.spans[2].tag.unit, 4) << "rank 1's kernel goes to rank 1's span, not rank 0's at the same time";
  EXPECT_EQ(r.spans[3].stream, "comm.kernels");
  EXPECT_EQ(r.spans[3].tag.unit, -1);
  EXPECT_STREQ(r.spans[3].tag.what, "nccl");
  EXPECT_EQ(r.spans[4].tag.unit, -1) << "between two spans of its stream: in neither";
  EXPECT_EQ(names.size(), 5u);  // "fwd: gemm", "bwd: rmsnorm", "bwd: gemm", "nccl", "gap"
}

// sum_kernels against hand-made spans as attribute_activities writes them: kernel spans of the asked
// device summed by kernel with the phase prefix dropped, largest first; other devices, the CUDA-event
// spans (category "compute") and host spans ignored.
MeasuredSpan kernel_span(int rank, const char* category, const char* what, double start, double end) {
  MeasuredSpan s;
  s.rank = rank;
  s.stream = "compute.kernels";
  s.tag.category = category;
  s.tag.what = what;
  s.start_s = start;
  s.end_s = end;
  return s;
}

TEST(KernelActivity, SumsTheDevicesKernelSpansByKernelLargestFirst) {
  const std::vector<MeasuredSpan> spans = {
      kernel_span(0, "compute", "fwd", 0.0, 1.0),                               // the CUDA-event span: not a kernel
      kernel_span(0, "kernel", "fwd: rmsnorm_forward_kernel", 0.00, 0.01),
      kernel_span(0, "kernel", "fwd: attention_forward_tc_kernel<64>", 0.02, 0.52),
      kernel_span(0, "kernel", "fwd: rmsnorm_forward_kernel", 0.60, 0.62),
      kernel_span(0, "kernel", "memcpy DtoD", 0.70, 0.71),                      // outside any span: no prefix
      kernel_span(1, "kernel", "fwd: rmsnorm_forward_kernel", 0.0, 5.0),        // another device
      kernel_span(-1, "kernel", "host: something", 0.0, 5.0),                   // the host
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
}  // namespace slidedp::exec
