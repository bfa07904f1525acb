// Signals against slidedp-run as a user or a scheduler sends them, on a step slow enough never to end
// by itself (the embedded default emulated at 4x H100's ratios with --time-scale 1e6: one of its steps
// lasts tens of minutes here). A second SIGTERM, or the first once --stop-grace has passed, must end
// the process with 128 + SIGTERM and the run logged interrupted, the published checkpoints intact.
// Before, the stop flag was read only between steps: the process ran on until SIGKILL. A run that does
// not end within kHangS fails the test (it is killed); no test here asserts how fast it ends.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint.h"
#include "runlog/run_log.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;
constexpr double kHangS = 90;  // far above the 2 s grace and a poll of 20 ms: only a hang gets here

struct Child {
  pid_t pid = -1;
  int status = -1;
  bool ended = false;
};

Child spawn(const std::vector<std::string>& args, const fs::path& log) {
  Child c;
  c.pid = ::fork();
  if (c.pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);  // one offset for both streams
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return c;
}

// Waits up to kHangS for the child; kills it (and reports a hang) past that.
void wait_for(Child& c) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < kHangS) {
    if (::waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
      c.ended = true;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(c.pid, SIGKILL);
  ::waitpid(c.pid, &c.status, 0);
}

// Waits until the run has logged itself (so the signal arrives during training, not during start-up).
void wait_until_running(const fs::path& db) {
  for (int i = 0; i < 600; ++i) {
    if (fs::exists(db)) {
      try {
        const auto runs = runlog::RunLogReader(db.string()).list_runs();
        if (!runs.empty()) return;
      } catch (const std::exception&) {
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

struct Case {
  const char* name;
  std::vector<std::string> extra;
  int signals;  // SIGTERMs sent, 1 s apart
};

class Interrupt : public ::testing::TestWithParam<Case> {};

TEST_P(Interrupt, EndsTheRunPromptlyLoggedInterrupted) {
  const Case& k = GetParam();
  const fs::path dir = fs::temp_directory_path() / fmt::format("slidedp_interrupt_{}_{}", ::getpid(), k.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  // A first run publishes a checkpoint the interrupted one must leave intact.
  const std::string run = SLIDEDP_RUN_BIN;
  std::vector<std::string> first = {run, "--steps", "2", "--no-db", "-q", "--checkpoint-dir", (dir / "ckpt").string()};
  Child c0 = spawn(first, dir / "first.txt");
  wait_for(c0);
  ASSERT_TRUE(c0.ended && WIFEXITED(c0.status) && WEXITSTATUS(c0.status) == 0);
  const std::string published = resolve_checkpoint_dir((dir / "ckpt").string());

  std::vector<std::string> args = {run,        "--steps", "3", "--emulate", "h100-sxm-x4", "--time-scale", "1e6",
                                   "--db",     (dir / "runs.db").string(), "-q", "--resume", (dir / "ckpt").string(),
                                   "--checkpoint-dir", (dir / "ckpt").string()};
  args.insert(args.end(), k.extra.begin(), k.extra.end());
  Child c = spawn(args, dir / "out.txt");
  wait_until_running(dir / "runs.db");
  std::this_thread::sleep_for(std::chrono::seconds(1));  // into the first step
  for (int i = 0; i < k.signals; ++i) {
    ::kill(c.pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  wait_for(c);
  std::string out;
  {
    FILE* f = fopen((dir / "out.txt").c_str(), "r");
    char buf[4096];
    size_t n;
    while (f && (n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    if (f) fclose(f);
  }
  ASSERT_TRUE(c.ended) << "slidedp-run did not end within " << kHangS << " s of the signal:\n" << out;
  ASSERT_TRUE(WIFEXITED(c.status)) << "ended by a signal, not by itself:\n" << out;
  EXPECT_EQ(WEXITSTATUS(c.status), 128 + SIGTERM) << out;
  EXPECT_NE(out.find("interrupted"), std::string::npos) << out;
  const auto runs = runlog::RunLogReader((dir / "runs.db").string()).list_runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, runlog::RunStatus::kInterrupted);
  // The checkpoint published before is the newest complete one, and it loads.
  EXPECT_EQ(resolve_checkpoint_dir((dir / "ckpt").string()), published);
  EXPECT_NO_THROW(load_checkpoint(published));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Signals, Interrupt,
                         ::testing::Values(Case{"second_sigterm", {"--stop-grace", "0"}, 2},
                                           Case{"first_sigterm_past_the_grace", {"--stop-grace", "2"}, 1}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Two SIGTERMs while --save-model writes a 250 MB model: the run ends with 128 + SIGTERM, logged
// interrupted, and neither the destination nor a temp folder is left (before, both signals waited for
// the whole save, then exit 0: a scheduler's SIGKILL would catch a larger model mid-save). The signals
// go as soon as the save's temp folder appears; the save takes far longer than the 50 ms between them.
TEST(InterruptSave, ASecondSignalAbandonsTheSave) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("slidedp_interrupt_save_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "out");
  {
    // 8 layers of hidden 768 and a 32000-token vocabulary: 124 M parameters.
    FILE* f = fopen((dir / "config.json").c_str(), "w");
    ASSERT_TRUE(f);
    fputs(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768,
      "intermediate_size": 3072, "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 12,
      "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
      "tie_word_embeddings": false, "hidden_act": "silu"})", f);
    fclose(f);
  }
  const std::string run = SLIDEDP_RUN_BIN;
  Child c = spawn({run, "--model", (dir / "config.json").string(), "--steps", "0", "--db", (dir / "runs.db").string(),
                   "-q", "--save-model", (dir / "out/model").string()},
                  dir / "out.txt");
  bool saving = false;
  for (int i = 0; i < 6000 && !saving; ++i) {
    for (const auto& e : fs::directory_iterator(dir / "out"))
      if (e.path().filename().string().rfind(".tmp-", 0) == 0) saving = true;
    if (!saving) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(saving) << "the save never started";
  ::kill(c.pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(c.pid, SIGTERM);
  wait_for(c);
  ASSERT_TRUE(c.ended) << "slidedp-run did not end within " << kHangS << " s";
  ASSERT_TRUE(WIFEXITED(c.status)) << "ended by a signal, not by itself";
  EXPECT_EQ(WEXITSTATUS(c.status), 128 + SIGTERM);
  EXPECT_FALSE(fs::exists(dir / "out/model"));
  for (const auto& e : fs::directory_iterator(dir / "out")) ADD_FAILURE() << "left behind: " << e.path();
  const auto runs = runlog::RunLogReader((dir / "runs.db").string()).list_runs();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, runlog::RunStatus::kInterrupted);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace slidedp
