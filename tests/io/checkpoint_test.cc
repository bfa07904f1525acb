// Checkpoints: bitwise round trip of every field, rotation to the last K, the folder loads as a
// Hugging Face model, strict trainer_state.json, and a writer SIGKILLed mid-checkpoint (fork) leaving
// the previous checkpoint as the latest, its temp folder removed by the next save.
#include "io/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <filesystem>
#include <limits>
#include <thread>

#include "common/error.h"
#include "common/file_util.h"
#include "common/file_util.h"
#include "io/hf_model.h"
#include "io_test_util.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;
using testing::bitwise_equal;
using testing::random_units;
using testing::TempDir;
using testing::tiny_card;

struct State {
  ModelCard card;
  UnitBuffers master, m, v;
  TrainerState trainer;
  CheckpointData view() const { return {card, unit_spans(master), unit_spans(m), unit_spans(v), trainer}; }
};

State make_state(const ModelCard& card, uint64_t seed, int64_t step) {
  ModelLayout layout = make_model_layout(card);
  State s;
  s.card = card;
  s.master = random_units(layout, seed, /*bf16_exact=*/false);  // full fp32 precision must survive
  s.m = random_units(layout, seed + 1, false);
  s.v = random_units(layout, seed + 2, false);
  for (auto& u : s.v)
    for (auto& x : u) x = x * x;  // second moments are non-negative
  s.trainer.optimizer_step = step;
  s.trainer.adamw_step = step - step / 10;  // some steps skipped
  s.trainer.lr_schedule_step = step + 3;
  s.trainer.lr_schedule_json = R"({"kind":"cosine","lr":0.0003,"warmup_steps":2,"total_steps":200,"min_lr":1e-05})";
  s.trainer.learning_rate = 2.9999999e-4 * (1.0 + 1.0 / 3.0);  // not a short decimal: must round-trip exactly
  s.trainer.data_cursor = {2, 48, 100, 256, 0xfedcba9876543210ull};
  s.trainer.rng_state = {0x0123456789abcdefull, ~0ull, 0, seed};
  s.trainer.metadata_json = R"({"plan":{"ranks":2,"route":"sharded"},"note":"x"})";
  return s;
}

void expect_same(const LoadedCheckpoint& ck, const State& s) {
  EXPECT_EQ(model_card_to_hf_config(ck.card), model_card_to_hf_config(s.card));
  EXPECT_TRUE(bitwise_equal(ck.master, s.master));
  EXPECT_TRUE(bitwise_equal(ck.adam_m, s.m));
  EXPECT_TRUE(bitwise_equal(ck.adam_v, s.v));
  EXPECT_EQ(ck.state, s.trainer);
  EXPECT_EQ(std::bit_cast<uint64_t>(ck.state.learning_rate),
            std::bit_cast<uint64_t>(s.trainer.learning_rate));
}

TEST(Checkpoint, RoundTripIsBitwiseForEveryField) {
  TempDir root;
  for (const char* type : {"llama", "qwen2", "qwen3"}) {
    SCOPED_TRACE(type);
    State s = make_state(tiny_card(type, std::string(type) == "qwen3"), 10, 123);
    std::string dir = save_checkpoint(root / type, s.view(), 3);
    EXPECT_EQ(fs::path(dir).filename(), "step-00000123");
    LoadedCheckpoint ck = load_checkpoint(dir);
    expect_same(ck, s);
    // Saving what was loaded reproduces the files byte for byte.
    std::string again = save_checkpoint(root / (std::string(type) + "-again"), ck.view(), 3);
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json", "config.json"})
      EXPECT_EQ(testing::read_bytes(dir + "/" + f), testing::read_bytes(again + "/" + f)) << f;
  }
}

// Packed documents' end id rides in the data cursor (so a resume with another --document-end is
// refused); without documents the key is absent and the file is what it always was.
TEST(Checkpoint, TheDocumentEndRoundTripsAndIsAbsentWithoutDocuments) {
  TempDir root;
  State s = make_state(tiny_card("llama", false), 10, 7);
  const std::string plain = save_checkpoint(root / "plain", s.view(), 3);
  EXPECT_EQ(testing::read_bytes(plain + "/trainer_state.json").find("document_end"), std::string::npos);
  EXPECT_EQ(load_checkpoint(plain).state.data_cursor.document_end, -1);
  s.trainer.data_cursor.document_end = 10;
  const std::string docs = save_checkpoint(root / "docs", s.view(), 3);
  EXPECT_EQ(load_checkpoint(docs).state.data_cursor.document_end, 10);
  expect_same(load_checkpoint(docs), s);
}

TEST(Checkpoint, FolderIsAlsoAHuggingFaceModel) {
  TempDir root;
  State s = make_state(tiny_card("llama"), 20, 7);
  std::string dir = save_checkpoint(root.path(), s.view(), 0);
  HfModel m = load_hf_model(dir);  // config.json + fp32 model.safetensors under HF names
  EXPECT_TRUE(bitwise_equal(m.units, s.master));
  SafetensorsFile opt(dir + "/optimizer.safetensors");
  EXPECT_NE(opt.find("model.layers.1.mlp.down_proj.weight.exp_avg_sq"), nullptr);
  EXPECT_EQ(opt.metadata().at("format"), "pt");
}

TEST(Checkpoint, KeepsTheLastKAndFindsTheLatest) {
  TempDir root;
  EXPECT_FALSE(find_latest_checkpoint(root / "none").has_value());
  ModelCard card = tiny_card("llama");
  for (int64_t step : {5, 10, 15, 20, 25}) save_checkpoint(root.path(), make_state(card, 30, step).view(), 3);
  auto all = list_checkpoints(root.path());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].first, 15);
  EXPECT_EQ(all[2].first, 25);
  EXPECT_EQ(find_latest_checkpoint(root.path()), root / "step-00000025");
  // Saving the same step again replaces it atomically.
  State s = make_state(card, 31, 25);
  save_checkpoint(root.path(), s.view(), 3);
  expect_same(load_checkpoint(*find_latest_checkpoint(root.path())), s);
  // A checkpoint older than the newest ones (a run resumed from an earlier step) is never the one
  // deleted: it stays, with the newest keep_last - 1 others.
  save_checkpoint(root.path(), make_state(card, 33, 7).view(), 3);
  all = list_checkpoints(root.path());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].first, 7);
  EXPECT_EQ(all[1].first, 20);
  // Steps past 8 digits still sort numerically.
  save_checkpoint(root.path(), make_state(card, 32, 123456789).view(), 0);
  EXPECT_EQ(find_latest_checkpoint(root.path()), root / "step-123456789");
  for (const auto& e : fs::directory_iterator(root.path()))
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
}

TEST(Checkpoint, RejectsBadBuffersAndBadStateFiles) {
  TempDir root;
  State s = make_state(tiny_card("llama"), 40, 1);
  s.trainer.lr_schedule_json.clear();  // written as null
  State bad = s;
  bad.m[2].pop_back();
  EXPECT_THROW(save_checkpoint(root.path(), bad.view(), 3), InputError);
  bad = s;
  // input_layernorm.weight has C = 32 elements, padded to 64: element 32 of a decoder unit is padding.
  const ModelLayout layout = make_model_layout(s.card);
  const TensorSpec& norm = layout.units[1].tensors[0];
  ASSERT_LT(norm.offset + norm.numel, layout.units[1].tensors[1].offset);
  bad.master[1][static_cast<std::size_t>(norm.offset + norm.numel)] = 1.0f;
  try {
    save_checkpoint(root.path(), bad.view(), 3);
    FAIL() << "non-zero padding accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("padding"), std::string::npos) << e.what();
  }
  bad = s;
  bad.trainer.metadata_json = "{not json";
  EXPECT_THROW(save_checkpoint(root.path(), bad.view(), 3), InputError);
  EXPECT_FALSE(find_latest_checkpoint(root.path()).has_value());

  std::string dir = save_checkpoint(root.path(), s.view(), 3);
  const std::string state_path = dir + "/trainer_state.json";
  const std::string good = read_text_file(state_path);
  struct Case {
    std::string from, to, must_say;
  };
  const Case cases[] = {
      {"\"optimizer_step\": 1", "\"optimizer_step\": \"1\"", "optimizer_step"},
      {"\"lr_schedule_step\"", "\"lr_schedule_stepp\"", "lr_schedule_stepp"},
      {"\"0xfedcba9876543210\"", "\"fedcba\"", "data_cursor.seed"},
      {"\"format_version\": 2", "\"format_version\": 3", "format_version"},
      {"\"adamw_step\": 1", "\"adamw_step\": 2", "adamw_step"},  // more updates than steps
      {"\"lr_schedule\": null", "\"lr_schedule\": 3", "lr_schedule"},
      // the moments' format is fp32 or bf16 (the key appears only for bf16; added here)
      {"\"learning_rate\"", "\"optimizer_states\": \"int8\", \"learning_rate\"", "optimizer_states"},
      {"\"learning_rate\"", "\"optimizer_states\": 16, \"learning_rate\"", "optimizer_states"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.to);
    std::string text = good;
    ASSERT_NE(text.find(c.from), std::string::npos) << text;
    text.replace(text.find(c.from), c.from.size(), c.to);
    testing::write_bytes(state_path, text);
    try {
      load_checkpoint(dir);
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("trainer_state.json"), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.must_say), std::string::npos) << msg;
    }
  }
  testing::write_bytes(state_path, good);
  // An optimizer file with a bf16 moment would not resume exactly: refused, naming the tensor.
  std::string opt = dir + "/optimizer.safetensors";
  auto moments = unit_tensors_to_write(layout, unit_spans(s.m), ".exp_avg");
  for (auto& t : unit_tensors_to_write(layout, unit_spans(s.v), ".exp_avg_sq")) moments.push_back(t);
  write_safetensors(opt, moments, {});  // default dtype: BF16
  try {
    load_checkpoint(dir);
    FAIL() << "bf16 moments accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("F32"), std::string::npos) << e.what();
  }
}

// State no training step writes: a non-finite weight or moment, a negative second moment. Saving it
// is refused (exit 5: a poisoned update never reaches disk, the previous checkpoint stays the newest);
// loading a file that holds it is refused naming the file and the tensor element.
TEST(Checkpoint, ImpossibleStateIsNeitherWrittenNorLoaded) {
  TempDir root;
  const State s = make_state(tiny_card("llama"), 50, 4);
  const ModelLayout layout = make_model_layout(s.card);
  const TensorSpec& up = layout.units[2].tensors.back();  // layer 1's down_proj
  const auto at = static_cast<std::size_t>(up.offset + 3);
  struct Bad {
    UnitBuffers State::*field;
    float value;
    const char* must_say;
  };
  for (const Bad& b : {Bad{&State::master, std::numeric_limits<float>::infinity(), "master weight"},
                       Bad{&State::m, std::numeric_limits<float>::quiet_NaN(), "AdamW first moment"},
                       Bad{&State::v, -0.25f, "AdamW second moment"}}) {
    SCOPED_TRACE(b.must_say);
    State bad = s;
    (bad.*b.field)[2][at] = b.value;
    try {
      save_checkpoint(root / "save", bad.view(), 3);
      ADD_FAILURE() << "written";
    } catch (const NumericError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(b.must_say), std::string::npos) << msg;
      EXPECT_NE(msg.find(up.name + "[3]"), std::string::npos) << msg;
    }
  }
  EXPECT_FALSE(find_latest_checkpoint(root / "save").has_value());

  // The same values in files (written around the check, as a corrupted or hand-edited file would be).
  struct File {
    const char* file;
    const char* suffix;
    float value;
  };
  for (const File& f : {File{"model.safetensors", "", -std::numeric_limits<float>::infinity()},
                        File{"optimizer.safetensors", ".exp_avg_sq", -1.5f}}) {
    SCOPED_TRACE(f.file);
    const std::string dir = save_checkpoint(root / f.file, s.view(), 3);
    State bad = s;
    const bool model = std::string(f.file) == "model.safetensors";
    (model ? bad.master : bad.v)[2][at] = f.value;
    SafetensorsWriteOptions fp32;
    fp32.dtype = TensorDtype::kF32;
    if (model) {
      write_safetensors(dir + "/model.safetensors", unit_tensors_to_write(layout, unit_spans(bad.master), ""), fp32);
    } else {
      auto moments = unit_tensors_to_write(layout, unit_spans(bad.m), ".exp_avg");
      for (auto& t : unit_tensors_to_write(layout, unit_spans(bad.v), ".exp_avg_sq")) moments.push_back(t);
      write_safetensors(dir + "/optimizer.safetensors", moments, fp32);
    }
    try {
      load_checkpoint(dir);
      ADD_FAILURE() << "loaded";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(f.file), std::string::npos) << msg;
      EXPECT_NE(msg.find(up.name + f.suffix + "[3]"), std::string::npos) << msg;
    }
  }
}

// Files of format version 1 (before adamw_step and lr_schedule existed) still load: every step then
// applied its update, so adamw_step reads as optimizer_step, and no schedule is recorded.
TEST(Checkpoint, ReadsVersion1StateFiles) {
  TempDir root;
  State s = make_state(tiny_card("llama"), 40, 7);
  s.trainer.adamw_step = 7;
  s.trainer.lr_schedule_json.clear();
  const std::string dir = save_checkpoint(root.path(), s.view(), 3);
  std::string text = read_text_file(dir + "/trainer_state.json");
  for (const char* line : {"  \"adamw_step\": 7,\n", "  \"lr_schedule\": null,\n"}) {
    ASSERT_NE(text.find(line), std::string::npos) << text;
    text.erase(text.find(line), std::string(line).size());
  }
  text.replace(text.find("\"format_version\": 2"), 19, "\"format_version\": 1");
  testing::write_bytes(dir + "/trainer_state.json", text);
  const LoadedCheckpoint ck = load_checkpoint(dir);
  EXPECT_EQ(ck.state.optimizer_step, 7);
  EXPECT_EQ(ck.state.adamw_step, -1);  // "not recorded": the trainer reads it as optimizer_step
  EXPECT_TRUE(ck.state.lr_schedule_json.empty());
  // A version-1 file may not carry the version-2 keys.
  text.insert(text.find("\"optimizer_step\""), "\"adamw_step\": 7, ");
  testing::write_bytes(dir + "/trainer_state.json", text);
  EXPECT_THROW(load_checkpoint(dir), InputError);
}

// A child process writes checkpoint 2 and is SIGKILLed while doing it; the parent then finds
// checkpoint 1 as the latest, loads it intact, and the next save removes the dead writer's temp folder.
// Two variants: stopped at a known point (after model.safetensors, through the file hook) and killed
// as soon as its temp folder appears (wherever it happens to be).
void kill_mid_write(bool at_known_point) {
  TempDir root;
  ModelCard card =
      tiny_card("llama", false, /*layers=*/8, /*vocab=*/4096);  // ~ 0.6 M params, 7 MB per checkpoint
  State first = make_state(card, 50, 1);
  save_checkpoint(root.path(), first.view(), 3);
  State second = make_state(card, 60, 2);

  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CheckpointFileHook hook;
    if (at_known_point)
      hook = [](const std::string& file) {
        if (file == "model.safetensors") ::pause();  // wait here for the SIGKILL
      };
    try {
      save_checkpoint(root.path(), second.view(), 3, hook);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  // Wait for the child's temp folder (and, at the known point, for model.safetensors inside it).
  auto child_tmp = [&]() -> std::string {
    for (const auto& e : fs::directory_iterator(root.path())) {
      std::string name = e.path().filename().string();
      if (name.rfind(".tmp-step-00000002-" + std::to_string(child) + "-", 0) == 0) return e.path().string();
    }
    return "";
  };
  std::string tmp;
  for (int i = 0; i < 20000; ++i) {
    tmp = child_tmp();
    if (!tmp.empty() && (!at_known_point || fs::exists(tmp + "/model.safetensors"))) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  ASSERT_FALSE(tmp.empty()) << "child never created its temp folder";
  if (at_known_point) {
    // The hook runs after model.safetensors is fsynced; give the child time to reach pause().
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;

  auto latest = find_latest_checkpoint(root.path());
  ASSERT_TRUE(latest.has_value());
  if (at_known_point) {
    ASSERT_TRUE(killed);
    EXPECT_TRUE(fs::exists(tmp)) << "the partial checkpoint stays a temp folder";
    EXPECT_FALSE(fs::exists(tmp + "/trainer_state.json"));
    EXPECT_EQ(*latest, root / "step-00000001");
    expect_same(load_checkpoint(*latest), first);
  } else if (*latest == root / "step-00000002") {
    expect_same(load_checkpoint(*latest), second);  // the child finished before the kill: complete
  } else {
    EXPECT_EQ(*latest, root / "step-00000001");
    expect_same(load_checkpoint(*latest), first);
  }
  // The next save cleans up the dead writer's leftovers.
  State third = make_state(card, 70, 3);
  save_checkpoint(root.path(), third.view(), 3);
  for (const auto& e : fs::directory_iterator(root.path()))
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << "left behind: " << e.path();
  expect_same(load_checkpoint(*find_latest_checkpoint(root.path())), third);
}

TEST(Checkpoint, SigkillAtAKnownPointLeavesThePreviousCheckpointLatest) { kill_mid_write(true); }
TEST(Checkpoint, SigkillAsSoonAsTheWriteStartsLeavesAConsistentRoot) { kill_mid_write(false); }

}  // namespace
}  // namespace slidedp
