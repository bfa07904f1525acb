// Multi-node runs on one machine: slidedp-run under `mpirun -np M` (one process per node over
// loopback) against single-process runs. The references are independent runs, not tolerances: the
// cross-node sum keeps the single node's rank order (executor/cross_node.h; the CPU backend's
// reduce-scatter over every node's ranks for the gpu route), so M nodes x N ranks must write
// checkpoints bitwise equal to those of 1 node x M*N ranks, for both host-state placements and both
// gradient routes. Also: resume (on the same and on another node count), a node killed or hung mid-run
// (every other node exits in seconds, naming it; the last checkpoint resumes), bad launches.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "executor/backend_registry.h"
#include "io/checkpoint.h"
#include "io/hf_model.h"
#include "io/token_dataset.h"
#include "tests/shell_command.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;
using testing::run_shell;

const std::string kRun = SLIDEDP_RUN_BIN;
const std::string kMpirun = std::string(SLIDEDP_MPIRUN) + " --allow-run-as-root --oversubscribe";

fs::path scratch(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("slidedp_nodes_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The trained state of a checkpoint, bitwise: weights and AdamW moments, however many parts the folder
// was written in (trainer_state.json records the plan, which differs between the runs compared).
void expect_same_state(const fs::path& a, const fs::path& b) {
  const LoadedCheckpoint x = load_checkpoint(a.string()), y = load_checkpoint(b.string());
  for (const auto& [p, q, what] : {std::tuple{&x.master, &y.master, "master weights"}, std::tuple{&x.adam_m, &y.adam_m, "AdamW m"},
                                   std::tuple{&x.adam_v, &y.adam_v, "AdamW v"}}) {
    ASSERT_EQ(p->size(), q->size());
    for (size_t u = 0; u < p->size(); ++u)
      EXPECT_TRUE((*p)[u].size() == (*q)[u].size() &&
                  std::memcmp((*p)[u].data(), (*q)[u].data(), (*p)[u].size() * sizeof(float)) == 0)
          << what << " of unit " << u << " differ between " << a << " and " << b;
  }
}

// slidedp-tiny, 3 steps; `flags` adds to it.
std::string train(const fs::path& ckpt, const std::string& flags, int steps = 3) {
  return kRun + " --no-db -q --steps " + std::to_string(steps) + " --checkpoint-dir " + ckpt.string() + " " + flags;
}
std::string on_nodes(int nodes, const std::string& cmd) {
  return "timeout 300 " + kMpirun + " -np " + std::to_string(nodes) + " " + cmd + " --nodes " + std::to_string(nodes);
}

struct Case {
  const char* name;
  int nodes, ranks_per_node;
  std::string flags;
};

// slidedp-tiny with a tied head (the head's gradient contribution to unit 0 is a second part).
std::string tied_card(const fs::path& dir) {
  std::ofstream(dir / "tied.yaml") << "name: slidedp-tiny-tied\nhf_repo: none\nmodel_type: llama\nhidden_size: 128\n"
                                      "num_hidden_layers: 4\nnum_attention_heads: 4\nnum_key_value_heads: 2\nhead_dim: 32\n"
                                      "intermediate_size: 384\nvocab_size: 256\nmax_position_embeddings: 2048\n"
                                      "rope_theta: 10000.0\nrms_norm_eps: 1e-05\ntie_word_embeddings: true\n";
  return " --model " + (dir / "tied.yaml").string();
}

// One test per case (ctest runs them side by side; each launches its nodes under mpirun). Its name
// is the case's, printed the same way, so that ctest's test name is the name alone.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
class NodesTimesRanks : public ::testing::TestWithParam<Case> {};

const std::vector<Case>& nodes_times_ranks_cases() {
  static const std::vector<Case> all = {
      {"replicated_2x1", 2, 1, ""},
      {"sharded_2x1", 2, 1, "--host-state sharded"},
      {"replicated_2x2_accum", 2, 2, "--accum 2"},
      {"sharded_2x2_accum", 2, 2, "--accum 2 --host-state sharded"},
      {"replicated_3x1_clip", 3, 1, "--clip-grad-norm 0.5 --accum 2"},  // the chain through a middle node
      {"sharded_3x1_exact", 3, 1, "--host-state sharded --exact"},
      // The gpu route: one reduce-scatter over every node's ranks; each node's ranks receive exactly
      // the part its host state holds. Chunks of 10006 and 10007 elements split unevenly over 4 and 3
      // ranks (and 4 ranks split 10006 unlike 2 nodes would); fp32 gradients, whose sums round, so
      // that the order of addition shows.
      {"sharded_gpu_2x2_accum_exact", 2, 2,
       "--accum 2 --host-state sharded --grad-route gpu --chunk-numel 10006 --exact"},
      {"sharded_gpu_3x1_tied", 3, 1,
       "--host-state sharded --grad-route gpu --param-route replicated --chunk-numel 10007 TIED"},
      // A sharded state clips and skips too: each node's part's sum of squares, added in node order.
      // That double may differ from one node's in its last bits, which changes the clip coefficient
      // only if it straddles a rounding boundary of the fp32 it is cast to (odds about 1e-9).
      {"sharded_2x2_clip", 2, 2, "--accum 2 --host-state sharded --clip-grad-norm 0.05"},
      // A NaN in global rank 2's gradient (node 1) of step 2: every node skips that step.
      {"sharded_gpu_2x2_skip", 2, 2,
       "--host-state sharded --grad-route gpu --on-nonfinite skip --test-inject-nan 1:2:2 --json"},
      // 8-bit moments: blocks are cut at every one of the nodes x ranks shards, the same 4 as one
      // node's 4 ranks, so each node updates whole blocks of its part and the runs agree bit for bit.
      {"sharded_gpu_2x2_8bit", 2, 2,
       "--host-state sharded --grad-route gpu --chunk-numel 10006 --optimizer-states 8bit"},
      {"replicated_2x1_8bit_accum", 2, 1, "--accum 2 --optimizer-states 8bit"},
  };
  return all;
}

TEST_P(NodesTimesRanks, EqualOneNodeWithAllRanksBitwise) {
  const Case& c = GetParam();
  SCOPED_TRACE(c.name);
  const fs::path dir = scratch(c.name);
  const int all = c.nodes * c.ranks_per_node;
  std::string flags = c.flags;
  if (const size_t t = flags.find(" TIED"); t != std::string::npos) flags.replace(t, 5, tied_card(dir));
  auto one = run_shell(train(dir / "one", flags + " --ranks " + std::to_string(all)));
  ASSERT_EQ(one.code, 0) << one.out;
  auto many = run_shell(
      on_nodes(c.nodes, train(dir / "many", flags + " --ranks " + std::to_string(c.ranks_per_node))));
  ASSERT_EQ(many.code, 0) << many.out;
  expect_same_state(dir / "one/step-00000003", dir / "many/step-00000003");
  if (flags.find("--test-inject-nan") != std::string::npos) {
    for (const auto* run : {&one, &many}) {
      EXPECT_NE(run->out.find("\"skipped\": true"), std::string::npos) << run->out;
    }
  }
  // The same loss is reported: node 0 sums every node's losses in global rank order.
  EXPECT_TRUE(many.out.find("checkpoint: ") != std::string::npos ||
              many.out.find("\"checkpoint\": ") != std::string::npos)
      << many.out;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(MultiNode, NodesTimesRanks, ::testing::ValuesIn(nodes_times_ranks_cases()),
                         [](const auto& tp) { return std::string(tp.param.name); });

TEST(MultiNode, ShardedStateResumesBitExactOnTheSameAndOnAnotherNodeCount) {
  const fs::path dir = scratch("resume");
  // Straight: 4 steps on 2 nodes of 3 ranks, checkpoints every 2.
  auto r = run_shell(on_nodes(2, train(dir / "straight", "--ranks 3 --host-state sharded --checkpoint-every 2 --keep-checkpoints 5", 4)));
  ASSERT_EQ(r.code, 0) << r.out;
  // Each node wrote its part of the one folder (no node gathered the state), with the indexes.
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                        "optimizer-00002-of-00002.safetensors", "model.safetensors.index.json"})
    EXPECT_TRUE(fs::exists(dir / "straight/step-00000002" / f)) << f;
  // The same 6 ranks in the same global order, resumed at step 2 on 2 nodes, on 3 nodes of 2 ranks
  // (other shards: each node reads the ranges it holds) and on 1 node: the checkpoint does not depend
  // on the placement that wrote it.
  fs::create_directories(dir / "from2");
  fs::copy(dir / "straight/step-00000002", dir / "from2/step-00000002", fs::copy_options::recursive);
  const std::string from2 = " --resume " + (dir / "from2").string();
  r = run_shell(on_nodes(2, train(dir / "again", "--ranks 3 --host-state sharded" + from2, 2)));
  ASSERT_EQ(r.code, 0) << r.out;
  expect_same_state(dir / "straight/step-00000004", dir / "again/step-00000004");
  r = run_shell(on_nodes(3, train(dir / "three", "--ranks 2 --host-state sharded" + from2, 2)));
  ASSERT_EQ(r.code, 0) << r.out;
  expect_same_state(dir / "straight/step-00000004", dir / "three/step-00000004");
  r = run_shell(train(dir / "one_node", "--ranks 6" + from2, 2));
  ASSERT_EQ(r.code, 0) << r.out;
  expect_same_state(dir / "straight/step-00000004", dir / "one_node/step-00000004");
  fs::remove_all(dir);
}

// --save-model of a state sharded across nodes: every node writes its part of the Hugging Face folder
// (no node gathers the weights); the folder equals, weight for weight, the one node's.
TEST(MultiNode, AShardedStateSavesTheModelInOnePartPerNodeEqualToOneNodes) {
  const fs::path dir = scratch("save_model");
  auto one = run_shell(train(dir / "ck1", "--ranks 4 --save-model " + (dir / "one").string(), 2));
  ASSERT_EQ(one.code, 0) << one.out;
  auto many = run_shell(on_nodes(2, train(dir / "ck2", "--ranks 2 --host-state sharded --save-model " + (dir / "many").string(), 2)));
  ASSERT_EQ(many.code, 0) << many.out;
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                        "config.json"})
    EXPECT_TRUE(fs::exists(dir / "many" / f)) << f;
  const HfModel a = load_hf_model((dir / "one").string()), b = load_hf_model((dir / "many").string());
  ASSERT_EQ(a.units.size(), b.units.size());
  for (size_t u = 0; u < a.units.size(); ++u)
    EXPECT_TRUE(a.units[u].size() == b.units[u].size() &&
                std::memcmp(a.units[u].data(), b.units[u].data(), a.units[u].size() * sizeof(float)) == 0)
        << "unit " << u;
  fs::remove_all(dir);
}

// Two SIGTERMs to every node while a sharded state's --save-model writes its parts of a 124 M-parameter
// model: each node stops writing its part, node 0 removes the temp folder and the destination is not
// published (before, the nodes wrote their parts to the end whatever the signals, then
// published the folder). The signals go to the slidedp-run processes (not mpirun) as soon as node 0's
// temp folder appears; the parts take far longer than the 50 ms between them.
TEST(MultiNode, ASecondSignalAbandonsAShardedModelSaveOnEveryNode) {
  const fs::path dir = scratch("save_signal");
  fs::create_directories(dir / "out");
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768,
      "intermediate_size": 3072, "num_hidden_layers": 8, "num_attention_heads": 12, "num_key_value_heads": 12,
      "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
      "tie_word_embeddings": false, "hidden_act": "silu"})";
  const std::string out = (dir / "out").string();
  std::ofstream(dir / "signal.sh")
      << on_nodes(2, kRun + " --no-db -q --steps 0 --ranks 1 --host-state sharded --model " + (dir / "config.json").string() +
                         " --save-model " + out + "/model")
      << " > " << (dir / "log.txt").string() << " 2>&1 &\n"
      << "job=$!\n"
      << "for i in $(seq 6000); do ls -A " << out << " | grep -q '^[.]tmp-' && break; sleep 0.01; done\n"
      << "signal() { for p in $(pgrep -f -- '--save-model " << out << "/model'); do\n"
      << "  [ \"$(cat /proc/$p/comm 2>/dev/null)\" = slidedp-run ] && kill -TERM $p; done; }\n"
      << "signal; sleep 0.05; signal\n"
      << "wait $job; echo \"rc=$?\"\n";
  const auto r = run_shell("bash " + (dir / "signal.sh").string());
  const std::string log = read_file(dir / "log.txt");
  EXPECT_EQ(r.out.find("rc=0"), std::string::npos) << "the run ended as if nothing happened:\n" << r.out << log;
  EXPECT_NE(log.find("interrupted"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir / "out/model"));
  // Node 0 removes its temp folder on every way out; only when Open MPI kills it first (the other node
  // exits with MPI_Abort) may one stay, named after its dead writer, which the next save of the target
  // removes (HfModel.TheNextSaveCleansTheTempFolderOfAKilledSave).
  for (const auto& e : fs::directory_iterator(dir / "out")) {
    const std::string name = e.path().filename().string();
    const std::size_t dash = name.find('-', std::string(".tmp-model-").size());
    const std::string pid = name.rfind(".tmp-model-", 0) == 0 && dash != std::string::npos
                                ? name.substr(std::string(".tmp-model-").size(), dash - std::string(".tmp-model-").size())
                                : "";
    for (int i = 0; i < 100 && !pid.empty() && fs::exists("/proc/" + pid); ++i)  // (being killed by mpirun)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (pid.empty() || fs::exists("/proc/" + pid)) ADD_FAILURE() << "left behind: " << e.path() << "\n" << log;
  }
  fs::remove_all(dir);
}

// Every node writes its part of a sharded checkpoint into node 0's folder, so the nodes must share its
// file system. Two working folders (mpirun's per-process --wdir) and a relative --checkpoint-dir
// stand in for two hosts without a shared one: every node fails, naming the node, and no folder is
// published or left behind.
TEST(MultiNode, ACheckpointFolderNotSharedByEveryNodeFailsEveryNodeNamingIt) {
  const fs::path dir = scratch("unshared");
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  const std::string cmd = kRun + " --no-db -q --steps 1 --checkpoint-dir ck --host-state sharded --nodes 2";
  auto r = run_shell("timeout 300 " + kMpirun + " -np 1 --wdir " + (dir / "a").string() + " " + cmd + " : -np 1 --wdir " +
                     (dir / "b").string() + " " + cmd);
  EXPECT_EQ(r.code, 4) << r.out;  // an I/O error
  EXPECT_NE(r.out.find("node 1 cannot see the folder node 0 created"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("failed on node 1"), std::string::npos) << "node 0 should name the node:\n" << r.out;
  // The root this run created goes with it (the root's lease takes its marks back when nothing was published).
  EXPECT_TRUE(!fs::exists(dir / "a/ck") || fs::is_empty(dir / "a/ck")) << "neither a checkpoint nor a temp folder may stay";
  fs::remove_all(dir);
}

int64_t json_int(const std::string& out, const std::string& key) {
  const size_t at = out.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::stoll(out.substr(at + key.size() + 4));
}

double json_number(const std::string& out, const std::string& key) {
  const size_t at = out.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::stod(out.substr(at + key.size() + 4));
}

// The gpu route across nodes on the CUDA backend: one NCCL communicator over every node's GPUs
// (ncclCommInitRank with node 0's unique id sent over MPI). Two nodes on one machine need a GPU each
// (mpirun gives each process its own through CUDA_VISIBLE_DEVICES); with fewer it skips. The
// reference is one node with both GPUs; NCCL sums in its own order and the kernels are bf16, so the
// losses agree to 1e-3 (relative), not bitwise.
TEST(MultiNode, CudaGpuRouteAcrossNodesTrainsAsOneNodeWithAllGpus) {
  const int gpus = exec::cuda_device_count();
  if (gpus < 2)
    GTEST_SKIP() << "needs 2 GPUs: NCCL joins one GPU per rank, and 2 nodes on one machine need one each (" << gpus
                 << " visible; CI and the one-GPU check machine skip it)";
  const fs::path dir = scratch("cuda_gpu_route");
  const std::string flags = " --backend cuda --json --grad-route gpu --param-route sharded";
  auto one = run_shell(train(dir / "one", flags + " --ranks 2"));
  ASSERT_EQ(one.code, 0) << one.out;
  const std::string node = train(dir / "many", flags + " --ranks 1 --host-state sharded --nodes 2");
  auto many = run_shell("timeout 300 " + kMpirun + " -np 1 -x CUDA_VISIBLE_DEVICES=0 " + node + " : -np 1 -x CUDA_VISIBLE_DEVICES=1 " + node);
  ASSERT_EQ(many.code, 0) << many.out;
  const double a = json_number(one.out, "final_loss"), b = json_number(many.out, "final_loss");
  EXPECT_NEAR(a, b, 1e-3 * std::abs(a)) << one.out << many.out;
  fs::remove_all(dir);
}

TEST(MultiNode, ShardedHostStateHoldsOneNthOfMasterAndMomentsPerNode) {
  const fs::path dir = scratch("memory");
  auto rep = run_shell(on_nodes(2, train(dir / "r", "--json", 1)));
  auto sh = run_shell(on_nodes(2, train(dir / "s", "--json --host-state sharded", 1)));
  ASSERT_EQ(rep.code, 0) << rep.out;
  ASSERT_EQ(sh.code, 0) << sh.out;
  const int64_t R = json_int(rep.out, "host_state_bytes"), S = json_int(sh.out, "host_state_bytes");
  const int64_t P = json_int(rep.out, "parameters");
  ASSERT_GT(R, 0);
  ASSERT_GT(P, 0);
  // Replicated: X + 2P (X: fp32 master, m, v and accumulators; the bf16 mirror stays whole);
  // sharded on 2 nodes: X/2 + 2P, node 0 holding the odd element of a chunk (12-16 bytes each).
  const int64_t X = R - 2 * P;
  EXPECT_NEAR(static_cast<double>(S), static_cast<double>(X / 2 + 2 * P), 16.0 * 64) << "replicated " << R << ", sharded " << S;
  fs::remove_all(dir);
}

// The PID of node `node`'s process of a job whose command line contains `marker`.
pid_t node_pid(const std::string& marker, int node) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_file(e.path() / "cmdline");
    for (char& ch : cmd)
      if (ch == '\0') ch = ' ';
    if (cmd.find(marker) == std::string::npos || cmd.find("slidedp-run") == std::string::npos ||
        cmd.find("mpirun") != std::string::npos || cmd.find("timeout") == 0)
      continue;
    std::string env = read_file(e.path() / "environ");
    if (env.find("OMPI_COMM_WORLD_RANK=" + std::to_string(node) + '\0') != std::string::npos) return std::stoi(name);
  }
  return -1;
}

// Starts a long multi-node run in the background; returns the file its output goes to.
struct Background {
  fs::path out, code;
  void start(const std::string& cmd) { ASSERT_EQ(std::system(("(" + cmd + " > " + out.string() + " 2>&1; echo $? > " + code.string() + ") &").c_str()), 0); }
  // Seconds until the job exited (-1: not within `limit_s`).
  double wait_exit(double limit_s) const {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (fs::exists(code) && !read_file(code).empty()) return s;
      if (s > limit_s) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
};

bool wait_for(const fs::path& p, double limit_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(p)) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

TEST(MultiNode, AKilledNodeEndsEveryNodeAndTheLastCheckpointResumes) {
  const fs::path dir = scratch("killed");
  const std::string marker = (dir / "ckpt").string();
  Background job{dir / "out.txt", dir / "code.txt"};
  job.start(on_nodes(2, train(dir / "ckpt", "--host-state sharded --checkpoint-every 1 --keep-checkpoints 100", 100000)));
  ASSERT_TRUE(wait_for(dir / "ckpt/step-00000002", 120)) << read_file(job.out);
  const pid_t victim = node_pid(marker, 1);
  ASSERT_GT(victim, 0) << "node 1's process not found";
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const double took = job.wait_exit(60);
  ASSERT_GE(took, 0) << "the job did not end within 60 s of a node's death:\n" << read_file(job.out);
  EXPECT_LT(took, 30);  // a bound on a hang, not a speed figure (mpirun's own reaction takes < 1 s)
  EXPECT_NE(std::stoi(read_file(job.code)), 0);
  const std::string out = read_file(job.out);
  EXPECT_NE(out.find("rank 1"), std::string::npos) << "the message should name the lost node:\n" << out;
  // The newest complete checkpoint resumes.
  auto r = run_shell(on_nodes(2, train(dir / "after", "--host-state sharded --resume " + marker, 1)));
  EXPECT_EQ(r.code, 0) << r.out;
  fs::remove_all(dir);
}

TEST(MultiNode, AHungNodeFailsTheRunWithinTheTimeoutNamingIt) {
  const fs::path dir = scratch("hung");
  const std::string marker = (dir / "ckpt").string();
  Background job{dir / "out.txt", dir / "code.txt"};
  job.start(on_nodes(2, train(dir / "ckpt", "--checkpoint-every 1 --node-timeout 10", 100000)));
  ASSERT_TRUE(wait_for(dir / "ckpt/step-00000002", 120)) << read_file(job.out);
  const pid_t victim = node_pid(marker, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);  // alive but silent: only the timeout can tell
  const double took = job.wait_exit(90);
  if (took < 0) ::kill(victim, SIGKILL);
  ASSERT_GE(took, 0) << "no exit within 90 s of a node hanging:\n" << read_file(job.out);
  EXPECT_NE(std::stoi(read_file(job.code)), 0);
  const std::string out = read_file(job.out);
  // Node 0 waits on the stopped node either for its part (a receive) or for it to take node 0's (a
  // send larger than MPI's eager limit completes only when the receiver matches it): which one comes
  // first depends on where the stop lands. Either names node 1.
  EXPECT_TRUE(out.find("to hear from node 1") != std::string::npos ||
              out.find("to send to node 1") != std::string::npos)
      << out;
  fs::remove_all(dir);
}

TEST(MultiNode, TheProfilerMeasuresTheNetworkBetweenProcessesIntoAProfileThePlannerUses) {
  const fs::path dir = scratch("profile");
  const std::string prof = std::string(SLIDEDP_PROFILE_BIN) + " --smoke --no-db -q --json --out ";
  auto r = run_shell("timeout 300 " + kMpirun + " -np 2 " + prof + (dir / "net.yaml").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\"network\": {"), std::string::npos) << r.out;
  const std::string yaml = read_file(dir / "net.yaml");
  EXPECT_NE(yaml.find("nic_gbps: "), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("network.nic_gbps: \"measured by slidedp-profile"), std::string::npos) << yaml;
  // The profile describes a cluster of such hosts: a 2-node plan predicts on it (a profile without a
  // network is refused for nodes > 1).
  const std::string predict = std::string(SLIDEDP_PREDICT_BIN) + " --model slidedp-tiny --seq 128 --ranks 2 --nodes 2 --hardware ";
  r = run_shell(predict + (dir / "net.yaml").string());
  EXPECT_EQ(r.code, 0) << r.out;
  // One process: no network stage, and the 2-node prediction is refused for want of a network.
  r = run_shell(prof + (dir / "alone.yaml").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("\"network\": {"), std::string::npos);
  r = run_shell(predict + (dir / "alone.yaml").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("network.nic_gbps"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(MultiNode, TheRunLogHasOneRunEachStepOnceAndEveryNodesPhasesTagged) {
  const fs::path dir = scratch("runlog");
  const std::string db = (dir / "runs.db").string();
  auto r = run_shell(on_nodes(2, kRun + " -q --steps 3 --db " + db));
  ASSERT_EQ(r.code, 0) << r.out;
  auto q = [&](const std::string& sql) {
    auto out = run_shell("sqlite3 " + db + " \"" + sql + "\"");
    EXPECT_EQ(out.code, 0) << out.out;
    return out.out;
  };
  EXPECT_EQ(q("SELECT count(*) FROM runs"), "1\n");
  EXPECT_EQ(q("SELECT count(*) FROM steps"), "3\n");
  EXPECT_EQ(q("SELECT group_concat(n) FROM (SELECT DISTINCT node AS n FROM phase_totals ORDER BY n)"), "0,1\n");
  // Each node's two ranks computed in every step, and each node's host ran its update.
  EXPECT_EQ(q("SELECT count(*) FROM phase_totals WHERE category = 'compute'"), "12\n");
  EXPECT_EQ(q("SELECT count(DISTINCT node) FROM phase_totals WHERE category = 'cpu_update' AND rank IS NULL"), "2\n");
  // Every rank's copies of every step carry their bytes, node 1's (sent to node 0) as node 0's.
  EXPECT_EQ(q("SELECT count(*) FROM phase_totals WHERE category IN ('h2d', 'd2h') AND bytes > 0"), "24\n");
  EXPECT_EQ(q("SELECT count(*) FROM phase_totals WHERE category IN ('h2d', 'd2h') AND bytes IS NULL"), "0\n");
  fs::remove_all(dir);
}

// Evaluation across nodes (--eval-data): each node's ranks evaluate their share of the held-out
// sequences (15 of them over 4 ranks: the last micro-batch is part padding) and the nodes' sums are
// added. The same loss over the same targets as one node with every rank; the sums group differently
// ((a + b) + (c + d) against a + b + c + d), so equal to a few double roundings, not bitwise.
TEST(MultiNode, EvaluationOverNodesEqualsOneNodes) {
  const fs::path dir = scratch("eval");
  std::vector<uint32_t> tokens(15 * 128 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 2654435761u) >> 7) % 256;
  write_token_file((dir / "eval.tok").string(), tokens, {}, 256, TokenDtype::kUint16);
  const std::string flags = " --json --seq 128 --eval-every 1 --eval-data " + (dir / "eval.tok").string();
  auto one = run_shell(train(dir / "one", flags + " --ranks 4", 2));
  ASSERT_EQ(one.code, 0) << one.out;
  auto many = run_shell(on_nodes(2, train(dir / "many", flags + " --ranks 2", 2)));
  ASSERT_EQ(many.code, 0) << many.out;
  auto evals = [](const std::string& out) {
    return nlohmann::json::parse(out.substr(out.find('{'), out.rfind('}') - out.find('{') + 1))["evals"];
  };
  const auto a = evals(one.out), b = evals(many.out);
  ASSERT_EQ(a.size(), 2u) << one.out;
  ASSERT_EQ(b.size(), 2u) << many.out;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(a[i]["tokens"], 15 * 128);
    EXPECT_EQ(b[i]["tokens"], 15 * 128);
    const double x = a[i]["loss"], y = b[i]["loss"];
    EXPECT_NEAR(x, y, 1e-12 * x) << "evaluation after step " << i + 1;
  }
  fs::remove_all(dir);
}

// Every option of slidedp-run, read from its --help (so a new option is covered without this test
// naming it), given to node 1 only with a value its parser accepts: the job stops at start-up, exit 2,
// naming the option and both nodes' values, before any work (no checkpoint folder). Before, options the
// start-up check did not list (--no-decay-on, --router-aux-loss-coef, ...) trained on with mixed
// weights, and checkpoint or save flags on one node stalled the others until --node-timeout.
TEST(MultiNode, EveryOptionGivenToOneNodeOnlyIsRefusedNamingIt) {
  const fs::path dir = scratch("options");
  const std::string help = run_shell(kRun + " --help").out;
  const std::regex line(R"(^\s+(?:-\w,)?(--[a-z0-9-]+)(?: ([A-Z]+)(?::(\S+))?)?(?: x 2)?(?:\s|$))");
  int varied = 0;
  std::istringstream in(help);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_search(l, m, line) || m[1] == "--help") continue;
    const std::string opt = m[1], type = m[2], check = m[3];
    if (opt == "--json" || opt == "--quiet") continue;  // what only node 0 prints may differ
    std::string value;
    if (type.empty()) value = "";  // a flag
    else if (opt == "--adam-betas") value = "0.9,0.99";
    else if (opt == "--test-inject-nan") value = "0:0:0";
    else if (!check.empty() && check.front() == '{') value = check.substr(1, check.find_first_of(",}") - 1);
    else if (type == "INT" || type == "UINT") value = "3";
    else if (type == "FLOAT") value = "0.5";
    else value = "x";
    SCOPED_TRACE(opt + " " + value);
    // Node 1 gets node 0's command with `opt` added, or replaced where node 0's has it.
    const std::map<std::string, std::string> node0 = {{"--no-db", ""}, {"--quiet", ""}, {"--steps", "3"},
                                                      {"--checkpoint-dir", (dir / "ckpt").string()}, {"--nodes", "2"}};
    std::map<std::string, std::string> node1 = node0;
    if (type.empty() && node0.count(opt)) node1.erase(opt);  // a flag node 0 has: node 1 goes without
    else if (node0.count(opt) && node0.at(opt) == value) value = "4", node1[opt] = value;
    else node1[opt] = value;
    auto command = [&](const std::map<std::string, std::string>& args) {
      std::string c = kRun;
      for (const auto& [k, v] : args) c += " " + k + (v.empty() ? "" : " " + v);
      return c;
    };
    const auto r = run_shell("timeout 120 " + kMpirun + " -np 1 " + command(node0) + " : -np 1 " + command(node1));
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(opt + ": node 0 has"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir / "ckpt")) << "work began before the check";
    ++varied;
  }
  EXPECT_GE(varied, 50) << "the --help listing was not parsed:\n" << help;
  fs::remove_all(dir);
}

TEST(MultiNode, BadLaunchesAreRefusedBeforeAnyWork) {
  const fs::path dir = scratch("bad");
  // --nodes 2 without a launcher.
  auto r = run_shell(train(dir / "a", "--nodes 2"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("mpirun -np 2"), std::string::npos) << r.out;
  // A launcher with another process count than the plan's nodes.
  r = run_shell("timeout 120 " + kMpirun + " -np 2 " + train(dir / "b", "--nodes 3"));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the plan has 3 nodes but the launcher started 2"), std::string::npos) << r.out;
  // Nodes that do not agree (here: the step count) stop at start-up, naming the field.
  r = run_shell("timeout 120 " + kMpirun + " -np 1 " + train(dir / "c", "--nodes 2", 3) + " : -np 1 " +
                train(dir / "c", "--nodes 2", 4));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("steps: node"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "c")) << "no work before the check";
  // The gpu route's reduce-scatter over every node leaves each node only its part of the sum: a
  // replicated state cannot take it.
  r = run_shell("timeout 120 " + kMpirun + " -np 2 " + train(dir / "e", "--nodes 2 --ranks 2 --grad-route gpu"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("plan: host_state"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "e"));
  // Under a launcher with a one-node plan.
  r = run_shell("timeout 120 " + kMpirun + " -np 2 " + train(dir / "d", ""));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("pass --nodes N"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace slidedp
