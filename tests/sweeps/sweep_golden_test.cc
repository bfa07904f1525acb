// A regression snapshot, not a check of correctness: the stored rows were written by this code, so
// nothing here says the predictions are right (the model's own tests check its parts against closed
// forms and the simulator, and sweeps/specs/validation.yaml against published runs). What it catches
// is an unintended change: the spec tests/data/sweeps/golden.yaml evaluated now, against the rows stored
// in tests/data/sweeps/golden_points.csv (every column of points.csv except the timing). A change that
// moves a chosen plan or a prediction fails here until the file is regenerated deliberately:
//   SLIDEDP_UPDATE_SWEEP_GOLDEN=1 ./build/tests/sweeps/test_sweeps_golden   (or
//   tests/sweeps/update_goldens.sh)
// and the diff is reviewed like code.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "common/file_util.h"
#include "sweeps/sweep_report.h"
#include "sweeps/sweep_runner.h"
#include "sweeps/sweep_spec.h"

namespace slidedp {
namespace {

const char* kSpec = "tests/data/sweeps/golden.yaml";
const char* kGolden = "tests/data/sweeps/golden_points.csv";

// points.csv without the stamp line and without the last column (eval_s, a wall time).
std::string golden_view(const SweepResult& res) {
  std::vector<std::string> cols = sweep_csv_columns();
  EXPECT_EQ(cols.back(), "eval_s");
  cols.pop_back();
  std::string out = "# " + std::string(kSpec) +
                    " evaluated by the analytical model; regenerate with SLIDEDP_UPDATE_SWEEP_GOLDEN=1\n";
  for (std::size_t i = 0; i < cols.size(); ++i) out += (i ? "," : "") + cols[i];
  out += "\n";
  for (const SweepRow& r : res.rows) {
    std::vector<std::string> cells = sweep_csv_cells(r);
    cells.pop_back();
    for (std::size_t i = 0; i < cells.size(); ++i) {
      std::string c = cells[i];
      if (c.find_first_of(",\"") != std::string::npos) {
        std::string q = "\"";
        for (char ch : c) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
        c = q + "\"";
      }
      out += (i ? "," : "") + c;
    }
    out += "\n";
  }
  return out;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

TEST(SweepGolden, PointsMatchTheStoredRows) {
  const SweepResult res = run_sweep(load_sweep_spec(kSpec));
  const std::string got = golden_view(res);
  const char* update = std::getenv("SLIDEDP_UPDATE_SWEEP_GOLDEN");
  if (update && std::string(update) == "1") {
    write_file_atomic(kGolden, got);
    GTEST_SKIP() << "wrote " << kGolden;
  }
  ASSERT_TRUE(std::filesystem::exists(kGolden))
      << kGolden << " is missing; run with SLIDEDP_UPDATE_SWEEP_GOLDEN=1";
  const std::vector<std::string> want = lines(read_text_file(kGolden)), have = lines(got);
  ASSERT_EQ(want.size(), have.size()) << "the golden spec's point count changed";
  ASSERT_GE(have.size(), 2u);
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(have[i], want[i]) << "row " << i - 1 << " of " << kGolden << " changed (columns: " << have[1]
                                << ").\nIf the change is intended, regenerate with "
                                   "SLIDEDP_UPDATE_SWEEP_GOLDEN=1 and review the diff.";
  // The stored file covers what it should: feasible and infeasible points, every system, a what-if machine.
  EXPECT_NE(got.find(",slideformer-dp,1,"), std::string::npos);
  EXPECT_NE(got.find(",fsdp2,0,"), std::string::npos);
  EXPECT_NE(got.find("host.mem_bw_gbps=900"), std::string::npos);
}

}  // namespace
}  // namespace slidedp
