// The pipeline's overlap, seen on paced runs (slidedp-run --emulate): the CPU backend runs at a
// target machine's ratios, so links and the CPU update take the time they would there and the overlap
// the pipeline promises shows in the measured timeline. Two targets, each made for one bottleneck
// (the model names it: cpu_update, h2d link): a slow CPU update and slow host links, with a 16-layer
// toy model so the pipeline's fill and drain are a small part of a step. For each, structural checks
// on the timeline -- the updates of step s run while the backward of step s runs; the delivery of
// step s+1 starts before step s's last chunk is updated -- and one ratio within the test:
//   update-bound: the exposed time (step minus GPU compute) is below half that of the same plan run
//     serially (verify mode: every update after the backward);
//   link-bound: verify mode serializes only the update, which hides under the link time there (the
//     next step's deliveries start as soon as unit 0 is updated), so the serial reference is the run's
//     own transfer and update time laid end to end: the exposed time is below half of it.
// No absolute wall-clock time is asserted; the time scale (20) keeps the pacer's wake-up latency a
// few percent of each operation.
#include <gtest/gtest.h>

#include <algorithm>

#include "executor/trainer.h"
#include "model/hardware.h"
#include "tests/executor/executor_test_util.h"

namespace slidedp::exec {
namespace {

TrainOptions paced_options(const Hardware& target, bool serial) {
  TrainOptions o = testing::tiny_options(2, 2, 1, 4);
  o.card = testing::tiny16_card();
  o.plan.chunk_numel = 4096;  // several chunks per unit, so updates and deliveries interleave
  o.plan.update_threads = 1;
  o.update_threads = 1;
  o.emulate = target;
  o.time_scale = 20.0;
  o.trace = true;
  if (serial) o.optimizer.clip_grad_norm = 1e30;  // verify mode: same values, every update after backward
  return o;
}

struct Span {
  double start, end;
};
std::vector<Span> spans(const TrainResult& r, const std::string& category, const std::string& what, int step, int rank) {
  std::vector<Span> out;
  for (const MeasuredSpan& s : r.spans)
    if (s.tag.category == category && s.tag.what == what && s.tag.step == step && (rank < 0 || s.rank == rank))
      out.push_back({s.start_s, s.end_s});
  return out;
}

// Over the steps after the first (it pays start-up): rank 0's busy time of a category.
double busy_s(const TrainResult& r, const std::string& category) {
  double b = 0;
  for (std::size_t i = 1; i < r.steps.size(); ++i) {
    const auto it = r.steps[i].busy_s.find(category);
    b += it == r.steps[i].busy_s.end() ? 0.0 : it->second;
  }
  return b;
}
// Step time minus rank 0's GPU compute.
double exposed_s(const TrainResult& r) {
  double e = 0;
  for (std::size_t i = 1; i < r.steps.size(); ++i) e += r.steps[i].wall_s;
  return e - busy_s(r, "compute");
}

enum class Reference { kVerifyRun, kSerializedSum };

void expect_overlap(const Hardware& target, Reference reference) {
  const TrainResult over = train(paced_options(target, false));
  const TrainResult serial = train(paced_options(target, true));
  ASSERT_EQ(over.steps.size(), 4u);
  // This host's real work fits the target's time for (nearly) every operation at this scale.
  EXPECT_LE(over.paced_overruns, over.paced_ops / 20) << over.paced_overruns << " of " << over.paced_ops;
  // Step 2 (index 1): an update of it runs while rank 0's backward of it runs.
  const int s = 1;
  // AdamW on chunks as they complete ("adamw"), or all of it after the backward ("verify+adamw").
  auto updates = spans(over, "cpu_update", "adamw", s, -1);
  for (const Span& v : spans(over, "cpu_update", "verify+adamw", s, -1)) updates.push_back(v);
  const auto backward = spans(over, "compute", "bwd", s, 0);
  ASSERT_FALSE(updates.empty());
  ASSERT_FALSE(backward.empty());
  const double bwd_end = std::max_element(backward.begin(), backward.end(), [](const Span& a, const Span& b) {
                           return a.end < b.end;
                         })->end;
  EXPECT_TRUE(std::any_of(updates.begin(), updates.end(), [&](const Span& u) { return u.start < bwd_end; }))
      << "no update of step 2 started before rank 0's backward of step 2 ended";
  // The delivery of step 3 starts before step 2's last chunk is updated.
  const double last_update = std::max_element(updates.begin(), updates.end(), [](const Span& a, const Span& b) {
                               return a.end < b.end;
                             })->end;
  const auto next = spans(over, "h2d", "params", s + 1, 0);
  ASSERT_FALSE(next.empty());
  const double first_next = std::min_element(next.begin(), next.end(), [](const Span& a, const Span& b) {
                              return a.start < b.start;
                            })->start;
  EXPECT_LT(first_next, last_update) << "step 3's first delivery waited for step 2's last update";
  // The serial reference exposes at least twice as much.
  const double serial_s = reference == Reference::kVerifyRun
                              ? exposed_s(serial)
                              : busy_s(over, "h2d") + busy_s(over, "d2h") + busy_s(over, "cpu_update");
  EXPECT_LT(exposed_s(over), 0.5 * serial_s) << "overlapped " << exposed_s(over) << " s exposed, serial " << serial_s << " s";
  // And the values are the same: pacing only stretches time.
  EXPECT_TRUE(testing::bitwise_equal(over, serial));
}

TEST(Overlap, UpdateBoundPacedRunOverlapsUpdatesWithBackward) {
  // 15 M parameters/s on one thread: the 90K parameters' update takes a little longer than the GPU
  // compute of a step (slidedp-predict on this target: bottleneck cpu_update, 79% busy).
  expect_overlap(testing::paced_target(10.0, 1.5e7), Reference::kVerifyRun);
}

TEST(Overlap, LinkBoundPacedRunOverlapsDeliveryWithComputeAndUpdates) {
  // 60 MB/s links: every layer's 18 KB of bf16 parameters, delivered twice a step, and its gradients
  // keep the H2D link busier than the GPU.
  expect_overlap(testing::paced_target(0.06, 1e8), Reference::kSerializedSum);
}

}  // namespace
}  // namespace slidedp::exec
