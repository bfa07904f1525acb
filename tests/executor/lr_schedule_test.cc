// Learning-rate schedules against closed forms written independently of the implementation (the
// cosine half-wave as cos^2, warm-up as a fraction), at step 1, the end of warm-up, mid-decay, the
// end and beyond; strict YAML validation naming the field; exact YAML round trip; resumability.
#include "executor/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "common/error.h"

namespace slidedp::exec {
namespace {

// A few fp64 roundings (cos, the affine mix) separate the two forms: 1e-14 relative is ~50 ulp, far
// below any difference a wrong formula (an off-by-one step, a missing floor) would make.
void expect_close(double got, double ref) {
  ASSERT_TRUE(std::isfinite(got));
  EXPECT_LE(std::abs(got - ref), 1e-14 * std::abs(ref)) << "got " << got << ", expected " << ref;
}

LrScheduleConfig cosine(double lr, int64_t warmup, int64_t total, double min_lr) {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kCosine;
  c.lr = lr;
  c.warmup_steps = warmup;
  c.total_steps = total;
  c.min_lr = min_lr;
  c.validate("test");
  return c;
}

TEST(LrSchedule, CosineAtTheLandmarks) {
  const LrScheduleConfig c = cosine(3e-4, 100, 1000, 3e-5);
  // (1 + cos(pi p)) / 2 == cos^2(pi p / 2): the reference uses the second form.
  auto ref = [&](double p) { return 3e-5 + (3e-4 - 3e-5) * std::pow(std::cos(std::numbers::pi * p / 2), 2); };
  expect_close(lr_at(c, 1), 3e-6);              // 1/100 of the peak: the first step already trains
  expect_close(lr_at(c, 50), 1.5e-4);           // half-way up the warm-up
  EXPECT_EQ(lr_at(c, 100), 3e-4);               // the end of warm-up is exactly the peak
  expect_close(lr_at(c, 101), ref(1.0 / 900));  // the first decay step is just below the peak
  expect_close(lr_at(c, 325), ref(0.25));
  expect_close(lr_at(c, 550), 1.65e-4);  // mid-decay: half-way between peak and floor
  expect_close(lr_at(c, 775), ref(0.75));
  expect_close(lr_at(c, 999), ref(899.0 / 900));
  EXPECT_EQ(lr_at(c, 1000), 3e-5);  // the end: exactly the floor
  EXPECT_EQ(lr_at(c, 1001), 3e-5);  // beyond: the floor stays
  EXPECT_EQ(lr_at(c, int64_t{1} << 40), 3e-5);
}

TEST(LrSchedule, CosineIsMonotoneAndContinuous) {
  const LrScheduleConfig c = cosine(1e-3, 7, 57, 0);
  double prev = 0;
  for (int64_t s = 1; s <= 7; ++s) {  // warm-up rises by lr / W per step
    EXPECT_GT(lr_at(c, s), prev);
    expect_close(lr_at(c, s) - prev, 1e-3 / 7);
    prev = lr_at(c, s);
  }
  for (int64_t s = 8; s <= 60; ++s) {
    EXPECT_LE(lr_at(c, s), prev) << "step " << s;
    // The largest step of a cosine over 50 steps is below lr * pi / 2 / 50 (the slope's maximum).
    EXPECT_LE(prev - lr_at(c, s), 1e-3 * std::numbers::pi / 2 / 50 + 1e-18) << "step " << s;
    prev = lr_at(c, s);
  }
  EXPECT_EQ(lr_at(c, 57), 0.0);
}

TEST(LrSchedule, CosineWithoutWarmupStartsDecayingAtStepOne) {
  const LrScheduleConfig c = cosine(2e-4, 0, 4, 0);
  // Steps 1..4 are progress 1/4, 2/4, 3/4, 1.
  expect_close(lr_at(c, 1), 2e-4 * (1 + std::sqrt(0.5)) / 2);
  expect_close(lr_at(c, 2), 1e-4);
  expect_close(lr_at(c, 3), 2e-4 * (1 - std::sqrt(0.5)) / 2);
  EXPECT_EQ(lr_at(c, 4), 0.0);
}

TEST(LrSchedule, ConstantWithAndWithoutWarmup) {
  LrScheduleConfig c;
  c.lr = 5e-5;
  c.validate("test");
  EXPECT_EQ(lr_at(c, 1), 5e-5);
  EXPECT_EQ(lr_at(c, 1000000), 5e-5);
  c.warmup_steps = 4;
  expect_close(lr_at(c, 1), 1.25e-5);
  expect_close(lr_at(c, 2), 2.5e-5);
  EXPECT_EQ(lr_at(c, 4), 5e-5);
  EXPECT_EQ(lr_at(c, 5), 5e-5);
}

// The checkpointed position is the step: rates computed in any order, as a resumed run would, agree
// bit for bit with a run from the start.
TEST(LrSchedule, PureFunctionOfTheStepSoResumeIsExact) {
  const LrScheduleConfig c = cosine(3e-4, 10, 200, 1e-5);
  std::vector<double> straight;
  for (int64_t s = 1; s <= 210; ++s) straight.push_back(lr_at(c, s));
  for (int64_t s = 210; s >= 1; s -= 7) EXPECT_EQ(lr_at(c, s), straight[static_cast<size_t>(s - 1)]);
  const LrScheduleConfig copy = lr_schedule_from_yaml(lr_schedule_to_yaml(c), "checkpoint");
  for (int64_t s = 120; s <= 210; ++s) EXPECT_EQ(lr_at(copy, s), straight[static_cast<size_t>(s - 1)]);
}

TEST(LrScheduleDeathTest, StepZeroIsAnInternalError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  LrScheduleConfig c;
  EXPECT_DEATH(lr_at(c, 0), "1-based");
}

TEST(LrScheduleYaml, ReadsBothKinds) {
  LrScheduleConfig c = lr_schedule_from_yaml(
      "kind: cosine\nlr: 3.0e-4\nwarmup_steps: 100\ntotal_steps: 1000\nmin_lr: 3e-5\n", "sched.yaml");
  EXPECT_EQ(c.kind, LrScheduleKind::kCosine);
  EXPECT_EQ(c.lr, 3e-4);
  EXPECT_EQ(c.warmup_steps, 100);
  EXPECT_EQ(c.total_steps, 1000);
  EXPECT_EQ(c.min_lr, 3e-5);
  EXPECT_EQ(c.summary(), "cosine 0.0003 -> 3e-05 over 1000 steps, 100 warm-up");

  c = lr_schedule_from_yaml("kind: constant\nlr: 1e-4\n", "sched.yaml");
  EXPECT_EQ(c.kind, LrScheduleKind::kConstant);
  EXPECT_EQ(c.lr, 1e-4);
  EXPECT_EQ(c.warmup_steps, 0);
  EXPECT_EQ(c.summary(), "constant 0.0001");

  c = lr_schedule_from_yaml("kind: cosine\nlr: 1e-3\ntotal_steps: 10\n", "sched.yaml");
  EXPECT_EQ(c.min_lr, 0.0);  // the floor defaults to zero
}

// Each bad input names the file and the field.
TEST(LrScheduleYaml, RejectsBadInputNamingTheField) {
  struct Case {
    const char* yaml;
    const char* field;
  };
  const Case cases[] = {
      {"lr: 1e-4\n", "kind"},                                                          // missing kind
      {"kind: linear\nlr: 1e-4\n", "kind"},                                            // unknown kind
      {"kind: constant\n", "lr"},                                                      // missing lr
      {"kind: constant\nlr: 0\n", "lr"},                                               // zero
      {"kind: constant\nlr: -1e-4\n", "lr"},                                           // negative
      {"kind: constant\nlr: 3e4\n", "lr"},                                             // 3e-4 mistyped
      {"kind: constant\nlr: .nan\n", "lr"},                                            // not finite
      {"kind: constant\nlr: fast\n", "lr"},                                            // not a number
      {"kind: constant\nlr: 1e-4\nwarmup_steps: -1\n", "warmup_steps"},                // negative
      {"kind: constant\nlr: 1e-4\nwarmup_steps: 2.5\n", "warmup_steps"},               // not an integer
      {"kind: constant\nlr: 1e-4\ntotal_steps: 100\n", "total_steps"},                 // other kind's key
      {"kind: constant\nlr: 1e-4\nmin_lr: 1e-5\n", "min_lr"},                          // other kind's key
      {"kind: constant\nlr: 1e-4\nwarmup_step: 10\n", "warmup_step"},                  // typo: unknown key
      {"kind: cosine\nlr: 1e-4\n", "total_steps"},                                     // missing end
      {"kind: cosine\nlr: 1e-4\nwarmup_steps: 10\ntotal_steps: 10\n", "total_steps"},  // no decay
      {"kind: cosine\nlr: 1e-4\ntotal_steps: 10\nmin_lr: 2e-4\n", "min_lr"},           // floor above peak
      {"kind: cosine\nlr: 1e-4\ntotal_steps: 10\nmin_lr: -1e-6\n", "min_lr"},          // negative floor
  };
  for (const Case& k : cases) {
    try {
      lr_schedule_from_yaml(k.yaml, "sched.yaml");
      ADD_FAILURE() << "accepted:\n" << k.yaml;
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("sched.yaml"), std::string::npos) << what;
      EXPECT_NE(what.find(k.field), std::string::npos) << "expected the field " << k.field << " in: " << what;
    }
  }
}

TEST(LrScheduleYaml, ProgrammaticValidationNamesOriginAndField) {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kCosine;
  c.lr = 1e-4;
  c.total_steps = 100;
  c.min_lr = 1e-3;
  try {
    c.validate("--lr-min");
    FAIL() << "min_lr above lr accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--lr-min: min_lr"), std::string::npos) << e.what();
  }
}

// The text form reads back to identical doubles, including ones with no short decimal form.
TEST(LrScheduleYaml, RoundTripIsExact) {
  const LrScheduleConfig c = cosine(1.0 / 3.0 * 1e-3, 17, 1234, 1.0 / 7.0 * 1e-5);
  const std::string text = lr_schedule_to_yaml(c);
  const LrScheduleConfig back = lr_schedule_from_yaml(text, "round trip");
  EXPECT_EQ(back.kind, c.kind);
  EXPECT_EQ(back.lr, c.lr) << text;
  EXPECT_EQ(back.warmup_steps, c.warmup_steps);
  EXPECT_EQ(back.total_steps, c.total_steps);
  EXPECT_EQ(back.min_lr, c.min_lr) << text;

  LrScheduleConfig k;
  k.lr = 3e-4;
  // Exponent forms keep a dot so that YAML 1.1 readers (PyYAML) see a float, not a string.
  EXPECT_EQ(lr_schedule_to_yaml(k), "kind: constant\nlr: 3.0e-04\nwarmup_steps: 0\n");
  k.lr = 0.5;
  EXPECT_EQ(lr_schedule_to_yaml(k), "kind: constant\nlr: 0.5\nwarmup_steps: 0\n");
}

}  // namespace
}  // namespace slidedp::exec
