// slidedp-profile end to end, as a user runs it: a smoke-scale profile of this machine written to a
// file, its raw samples in a fresh SQLite run log, --json on stdout; then slidedp-predict reads that
// profile. Bad flags exit with the input-error code. Binaries come from the build (compile definitions).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/hardware.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;

struct Ran {
  int code = -1;
  std::string out;
};

// Runs a shell command; stdout captured, stderr left to the test log.
Ran run(const std::string& cmd) {
  Ran r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  while (std::size_t n = fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class ProfileCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("slidedp_profile_cli_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

int64_t count_rows(const std::string& db, const std::string& sql) {
  sqlite3* h = nullptr;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) return -1;
  sqlite3_stmt* st = nullptr;
  int64_t n = -1;
  if (sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(h);
  return n;
}

TEST_F(ProfileCli, SmokeProfileIsWrittenLoggedAndReadBySlidedpPredict) {
  const std::string yaml = path("profile.yaml"), db = path("runs.db"), card = path("tiny.yaml");
  // A second model from a card file (the executor tests' tiny shape): unit times for both.
  {
    std::ofstream f(card);
    f << "name: tiny\nmodel_type: llama\nhidden_size: 32\nnum_hidden_layers: 3\nnum_attention_heads: 4\n"
         "num_key_value_heads: 2\nhead_dim: 8\nintermediate_size: 64\nvocab_size: 256\n";
  }
  Ran p = run(std::string(SLIDEDP_PROFILE_BIN) + " --smoke -q --model slidedp-tiny," + card +
              " --seq 16 --micro-batches 1,2 --ranks 2 --threads 1,2 --cpu-backend --json --out " + yaml +
              " --db " + db);
  ASSERT_EQ(p.code, 0) << p.out;
  nlohmann::json j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["scale"], "smoke");
  EXPECT_EQ(j["out"], yaml);
  ASSERT_TRUE(fs::exists(yaml));
  Hardware hw = load_hardware(yaml);
  EXPECT_TRUE(hw.gpu.emulated_on_host);
  EXPECT_NE(hw.find_unit_time("slidedp-tiny", UnitKind::kDecoder), nullptr);
  EXPECT_NE(hw.find_unit_time("tiny", UnitKind::kHead), nullptr);
  EXPECT_EQ(hw.unit_times.size(), 6u);

  // Every repetition of every case is a row of profile_samples, under a finished 'profile' run.
  std::size_t values = 0;
  for (const auto& m : j["measurements"]) values += m["values"].size();
  const int64_t run_id = j["db"]["run_id"];
  EXPECT_EQ(count_rows(db, "SELECT count(*) FROM profile_samples WHERE run_id = " + std::to_string(run_id)),
            static_cast<int64_t>(values));
  EXPECT_EQ(count_rows(db, "SELECT count(*) FROM runs WHERE kind = 'profile' AND status = 'finished'"), 1);

  Ran pred = run(std::string(SLIDEDP_PREDICT_BIN) + " --hardware " + yaml +
                 " --model slidedp-tiny --seq 16 --ranks 2 --micro-batch 2 --param-route sharded --json");
  ASSERT_EQ(pred.code, 0) << pred.out;
  nlohmann::json pj = nlohmann::json::parse(pred.out);
  EXPECT_GT(pj["step_time_s"].get<double>(), 0.0);
  EXPECT_EQ(pj["hardware"], hw.name);
}

// SIGTERM mid-profile (what a scheduler sends): exit 128 + 15 with the run logged interrupted and an
// error row saying so. It died by the signal before, its run left `running` for good.
TEST_F(ProfileCli, SigtermEndsTheProfileWithItsRunLoggedInterrupted) {
  const std::string db = path("runs.db");
  const std::string cmd = std::string(SLIDEDP_PROFILE_BIN) + " --quick -q --out " + path("p.yaml") + " --db " + db +
                          " > /dev/null 2>&1 & pid=$!; for i in $(seq 1 200); do sleep 0.1; [ -s " + db +
                          " ] && break; done; sleep 1; kill -TERM $pid; wait $pid; echo $?";
  const Ran r = run("bash -c '" + cmd + "'");
  EXPECT_EQ(r.out, "143\n") << "exit status of the profile";
  EXPECT_EQ(count_rows(db, "SELECT count(*) FROM runs WHERE status = 'interrupted'"), 1);
  EXPECT_EQ(count_rows(db, "SELECT count(*) FROM errors WHERE kind = 'interrupted'"), 1);
  EXPECT_FALSE(fs::exists(path("p.yaml")));
}

TEST_F(ProfileCli, BadFlagsExitWithTheInputErrorCode) {
  const std::string base = std::string(SLIDEDP_PROFILE_BIN) + " --smoke -q --no-db --out " + path("x.yaml");
  EXPECT_EQ(run(base + " --micro-batches 0 2>/dev/null").code, 2);
  EXPECT_EQ(run(base + " --micro-batches 1,x 2>/dev/null").code, 2);
  EXPECT_EQ(run(base + " --ranks 0 2>/dev/null").code, 2);
  EXPECT_EQ(run(base + " --model no-such-model 2>/dev/null").code, 2);
  EXPECT_EQ(run(base + " --quick 2>/dev/null").code, 2);  // --quick and --smoke together
  EXPECT_FALSE(fs::exists(path("x.yaml")));
  EXPECT_EQ(run(std::string(SLIDEDP_PROFILE_BIN) + " --help > /dev/null").code, 0);
}

}  // namespace
}  // namespace slidedp
