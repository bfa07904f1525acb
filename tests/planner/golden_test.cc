// A regression snapshot, not a check of correctness: the files were written by this code, so nothing
// here says the plans are right (the planner's correctness tests are search_test.cc against exhaustive
// enumeration, and e2e_test.cc against the executor). What it catches is an unintended change: the plan
// slidedp-plan chooses for a few fixed inputs (preset machines x models x goals), diffed against
// tests/data/planner/*.yaml. A change to the model or the search that changes a choice fails here
// until the files are regenerated deliberately:
//   SLIDEDP_UPDATE_PLANNER_GOLDEN=1 ./build/tests/planner/test_planner_golden
// (or tests/planner/update_goldens.sh), and the diff is reviewed like code.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/file_util.h"
#include "planner/report.h"
#include "planner/search.h"

namespace slidedp::planner {
namespace {

struct Golden {
  std::string name, model, hardware;
  int64_t seq = 0;
  int ranks = 1;
  Objective objective = Objective::kMatchedBatch;
  int64_t tokens = 0;  // global batch (matched) or the largest step (throughput)
};

void PrintTo(const Golden& g, std::ostream* os) { *os << g.name; }

std::vector<Golden> goldens() {
  return {
      {"h100-sxm-x8__qwen2.5-72b__matched", "qwen2.5-72b", "h100-sxm-x8", 4096, 8, Objective::kMatchedBatch,
       8 * 4096 * 8},
      {"h100-sxm-x4__qwen2.5-72b__matched", "qwen2.5-72b", "h100-sxm-x4", 4096, 4, Objective::kMatchedBatch,
       4 * 4096 * 16},
      {"rtx4090-x4__qwen2.5-7b__throughput", "qwen2.5-7b", "rtx4090-x4", 2048, 4, Objective::kMaxThroughput,
       1 << 19},
      {"a800-x4__llama-3.1-8b__matched", "llama-3.1-8b", "a800-x4", 4096, 4, Objective::kMatchedBatch,
       4 * 4096 * 4},
      {"cpu-dev__slidedp-tiny__matched", "slidedp-tiny", "cpu-dev", 128, 2, Objective::kMatchedBatch,
       2 * 128 * 4},
  };
}

std::string command(const Golden& g) {
  return fmt::format("slidedp-plan --hardware {} --model {} --seq {} --ranks {} {}", g.hardware, g.model,
                     g.seq, g.ranks,
                     g.objective == Objective::kMatchedBatch
                         ? fmt::format("--global-batch-tokens {}", g.tokens)
                         : fmt::format("--maximize throughput --max-global-batch-tokens {}", g.tokens));
}

class GoldenPlan : public ::testing::TestWithParam<Golden> {};

TEST_P(GoldenPlan, MatchesTheStoredPlan) {
  const Golden g = GetParam();
  const Workload w = make_workload(model_preset(g.model), g.seq);
  SearchSpec spec;
  spec.ranks = g.ranks;
  spec.objective = g.objective;
  if (g.objective == Objective::kMatchedBatch)
    spec.global_batch_tokens = g.tokens;
  else
    spec.max_global_batch_tokens = g.tokens;
  const SearchResult r = search_plans(w, hardware_preset(g.hardware), spec, {});
  const std::string got =
      "# " + command(g) + "\n" + plan_file_to_yaml(best_plan_file(r, g.model, g.hardware, g.seq));
  const std::string path = "tests/data/planner/" + g.name + ".yaml";
  const char* update = std::getenv("SLIDEDP_UPDATE_PLANNER_GOLDEN");
  if (update && std::string(update) == "1") {
    write_file_atomic(path, got);
    GTEST_SKIP() << "wrote " << path;
  }
  ASSERT_TRUE(std::filesystem::exists(path))
      << path << " is missing; run with SLIDEDP_UPDATE_PLANNER_GOLDEN=1";
  const std::string want = read_text_file(path);
  EXPECT_EQ(got, want) << "the chosen plan changed for: " << command(g) << "\nwhy: " << explain_choice(r)
                       << "\nIf the change is intended, regenerate with SLIDEDP_UPDATE_PLANNER_GOLDEN=1.";
  // The stored file is a plan file slidedp-run and slidedp-predict accept as it is.
  const PlanFile f = plan_file_from_yaml(want, path);
  EXPECT_NO_THROW(f.plan.validate(static_cast<int>(w.model.num_layers), path));
  EXPECT_EQ(f.model, g.model);
  EXPECT_EQ(f.hardware, g.hardware);
  EXPECT_EQ(f.seq_len, g.seq);
}

INSTANTIATE_TEST_SUITE_P(Presets, GoldenPlan, ::testing::ValuesIn(goldens()), [](const auto& tp) {
  std::string n = tp.param.name;
  for (char& c : n)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
});

}  // namespace
}  // namespace slidedp::planner
