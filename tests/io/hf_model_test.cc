// Hugging Face model folders: load -> save -> load bitwise (single file and sharded), bf16/f16/f32
// sources, tied embeddings, every mismatch against config.json as an error naming file and tensor,
// atomic replacement, and the independent Python checker run on what our writer produced.
#include "io/hf_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/file_util.h"
#include "io/fp16.h"
#include "io_test_util.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;
using testing::bitwise_equal;
using testing::error_of;
using testing::random_units;
using testing::TempDir;
using testing::tiny_card;
using testing::tiny_config_json;

// Writes a model folder by hand (not through save_hf_model): config.json plus one safetensors file of
// the given tensors. Lets tests drop, add or reshape tensors.
void write_model_dir(const std::string& dir, const std::string& config,
                     const std::vector<TensorToWrite>& tensors, TensorDtype dtype) {
  fs::create_directories(dir);
  write_file_atomic(dir + "/config.json", config);
  SafetensorsWriteOptions opt;
  opt.dtype = dtype;
  write_safetensors(dir + "/model.safetensors", tensors, opt);
}

TEST(HfModel, RoundTripSingleFileIsBitwise) {
  TempDir dir;
  ModelCard card = tiny_card("llama");
  ModelLayout layout = make_model_layout(card);
  UnitBuffers units = random_units(layout, 1, /*bf16_exact=*/true);
  save_hf_model(dir / "a", card, unit_spans(units));
  EXPECT_TRUE(fs::exists(dir / "a/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "a/model.safetensors.index.json"));

  HfModel m = load_hf_model(dir / "a");
  EXPECT_TRUE(bitwise_equal(m.units, units));
  EXPECT_EQ(model_card_to_hf_config(m.card), model_card_to_hf_config(card));

  save_hf_model(dir / "b", m.card, unit_spans(m.units));
  HfModel m2 = load_hf_model(dir / "b");
  EXPECT_TRUE(bitwise_equal(m2.units, m.units));
  // The files themselves are identical: the writer is deterministic.
  EXPECT_EQ(testing::read_bytes(dir / "a/model.safetensors"),
            testing::read_bytes(dir / "b/model.safetensors"));
  EXPECT_EQ(testing::read_bytes(dir / "a/config.json"), testing::read_bytes(dir / "b/config.json"));
}

TEST(HfModel, RoundTripShardedIsBitwise) {
  TempDir dir;
  ModelCard card = tiny_card("qwen2", false, /*layers=*/3);  // q/k/v biases
  ModelLayout layout = make_model_layout(card);
  UnitBuffers units = random_units(layout, 2, true);
  HfSaveOptions opt;
  opt.max_shard_bytes = 8 * 1024;  // tensors of 2-6 KiB: several shards
  save_hf_model(dir / "s", card, unit_spans(units), opt);
  ASSERT_TRUE(fs::exists(dir / "s/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "s/model.safetensors"));

  auto index = nlohmann::json::parse(read_text_file(dir / "s/model.safetensors.index.json"));
  std::set<std::string> shard_files;
  std::set<std::string> mapped;
  for (const auto& [name, file] : index["weight_map"].items()) {
    shard_files.insert(file.get<std::string>());
    mapped.insert(name);
  }
  std::vector<std::string> names = layout_tensor_names(layout, "");
  EXPECT_EQ(mapped, std::set<std::string>(names.begin(), names.end()));
  int64_t tensor_bytes = 0;
  for (const auto& u : layout.units)
    for (const auto& t : u.tensors) tensor_bytes += 2 * t.numel;  // bf16
  EXPECT_GT(shard_files.size(), 2u);
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), tensor_bytes);
  std::size_t n = shard_files.size();
  EXPECT_TRUE(shard_files.count(fmt::format("model-00001-of-{:05d}.safetensors", n)));
  EXPECT_TRUE(shard_files.count(fmt::format("model-{:05d}-of-{:05d}.safetensors", n, n)));

  HfModel m = load_hf_model(dir / "s");
  EXPECT_TRUE(bitwise_equal(m.units, units));
  save_hf_model(dir / "s2", m.card, unit_spans(m.units), opt);
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "s2").units, units));
  EXPECT_EQ(read_text_file(dir / "s/model.safetensors.index.json"),
            read_text_file(dir / "s2/model.safetensors.index.json"));
}

// A folder holding both model.safetensors and an index (a re-save beside stale shards): transformers
// loads model.safetensors, and so do we (the index was taken before, loading other weights silently).
TEST(HfModel, AFolderWithBothLayoutsLoadsModelSafetensorsAsTransformersDoes) {
  TempDir dir;
  ModelCard card = tiny_card("qwen2", false, /*layers=*/3);
  ModelLayout layout = make_model_layout(card);
  const UnitBuffers single = random_units(layout, 7, true), sharded = random_units(layout, 8, true);
  HfSaveOptions opt;
  opt.max_shard_bytes = 8 * 1024;
  save_hf_model(dir / "s", card, unit_spans(sharded), opt);
  save_hf_model(dir / "one", card, unit_spans(single));
  fs::copy_file(dir / "one/model.safetensors", dir / "s/model.safetensors");
  ASSERT_TRUE(fs::exists(dir / "s/model.safetensors.index.json"));
  const HfModel m = load_hf_model(dir / "s");
  EXPECT_TRUE(bitwise_equal(m.units, single));
  EXPECT_FALSE(bitwise_equal(m.units, sharded));
}

// Tensors above kReadTileElems are converted in several tiles on the load pool; each tile must land
// at its own offset (F16 here, so a wrong source offset would change values, not only their place).
TEST(HfModel, LargeTensorsLoadExactlyInParallelTiles) {
  TempDir dir;
  ModelCard card = tiny_card("llama", false, /*layers=*/1, /*vocab=*/40000);  // 1.28 M-element matrices
  ModelLayout layout = make_model_layout(card);
  ASSERT_GT(layout.units[0].tensors[0].numel, kReadTileElems);
  UnitBuffers units = random_units(layout, 11, false);
  for (auto& u : units)
    for (auto& x : u) x = half_to_float(float_to_half(x));  // exactly representable in F16
  write_model_dir(dir / "big", tiny_config_json("llama", false, 1, 40000),
                  unit_tensors_to_write(layout, unit_spans(units), ""), TensorDtype::kF16);
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "big").units, units));
  // The same through the serial path.
  UnitBuffers serial = zero_unit_buffers(layout);
  read_unit_tensors(SafetensorsSet::open_model_dir(dir / "big"), layout, "", serial);
  EXPECT_TRUE(bitwise_equal(serial, units));
}

TEST(HfModel, ShardPlanKeepsTensorsWholeAndOrdered) {
  EXPECT_EQ(plan_shards({4, 4, 4}, 8), (std::vector<std::vector<std::size_t>>{{0, 1}, {2}}));
  EXPECT_EQ(plan_shards({10, 1, 1}, 8),
            (std::vector<std::vector<std::size_t>>{{0}, {1, 2}}));  // oversize alone
  EXPECT_EQ(plan_shards({1, 10, 1}, 8), (std::vector<std::vector<std::size_t>>{{0}, {1}, {2}}));
  EXPECT_EQ(plan_shards({}, 8).size(), 0u);
}

TEST(HfModel, LoadsF16AndF32CheckpointsExactly) {
  TempDir dir;
  ModelCard card = tiny_card("mistral");
  ModelLayout layout = make_model_layout(card);
  UnitBuffers units = random_units(layout, 3, /*bf16_exact=*/false);
  auto tensors = unit_tensors_to_write(layout, unit_spans(units), "");

  write_model_dir(dir / "f32", tiny_config_json("mistral", false), tensors, TensorDtype::kF32);
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "f32").units, units));  // fp32 values kept exactly

  write_model_dir(dir / "f16", tiny_config_json("mistral", false), tensors, TensorDtype::kF16);
  HfModel m = load_hf_model(dir / "f16");
  for (std::size_t u = 0; u < layout.units.size(); ++u)
    for (const auto& t : layout.units[u].tensors)
      for (int64_t i = 0; i < t.numel; ++i) {
        float src = units[u][static_cast<std::size_t>(t.offset + i)];
        ASSERT_EQ(m.units[u][static_cast<std::size_t>(t.offset + i)], half_to_float(float_to_half(src)))
            << t.name;
      }
}

TEST(HfModel, TiedEmbeddingsMayOmitOrRepeatLmHead) {
  TempDir dir;
  ModelCard card = tiny_card("qwen3", /*tied=*/true);  // q/k norms, tied head
  ModelLayout layout = make_model_layout(card);
  EXPECT_EQ(layout.units.back().find("lm_head.weight"), nullptr);
  UnitBuffers units = random_units(layout, 4, true);
  save_hf_model(dir / "t", card, unit_spans(units));
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "t").units, units));

  // An exporter that wrote the shared matrix twice: accepted when equal, rejected when not.
  auto tensors = unit_tensors_to_write(layout, unit_spans(units), "");
  const TensorSpec& emb = layout.units[0].at("model.embed_tokens.weight");
  std::vector<float> head(units[0].begin() + emb.offset, units[0].begin() + emb.offset + emb.numel);
  tensors.push_back({"lm_head.weight", emb.shape, head});
  write_model_dir(dir / "t2", tiny_config_json("qwen3", true), tensors, TensorDtype::kBF16);
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "t2").units, units));
  head[5] += 1.0f;
  write_model_dir(dir / "t3", tiny_config_json("qwen3", true), tensors, TensorDtype::kBF16);
  std::string msg = error_of([&] { load_hf_model(dir / "t3"); });
  EXPECT_NE(msg.find("lm_head.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("differs"), std::string::npos) << msg;
}

TEST(HfModel, EveryMismatchWithTheConfigNamesFileAndTensor) {
  TempDir dir;
  ModelCard card = tiny_card("llama");
  ModelLayout layout = make_model_layout(card);
  UnitBuffers units = random_units(layout, 5, true);
  const auto good = unit_tensors_to_write(layout, unit_spans(units), "");
  const std::string config = tiny_config_json("llama", false);

  struct Case {
    const char* label;
    std::function<void(std::vector<TensorToWrite>&)> edit;
    std::vector<std::string> must_name;
  };
  std::vector<float> extra(7, 0.0f), wrong(32 * 33, 0.0f);
  const std::vector<Case> cases = {
      {"missing tensor",
       [](auto& t) {
         std::erase_if(t,
                       [](const TensorToWrite& x) { return x.name == "model.layers.1.mlp.up_proj.weight"; });
       },
       {"model.layers.1.mlp.up_proj.weight", "missing", "model.safetensors"}},
      {"untied model without lm_head",
       [](auto& t) { std::erase_if(t, [](const TensorToWrite& x) { return x.name == "lm_head.weight"; }); },
       {"lm_head.weight", "tie_word_embeddings"}},
      {"unexpected tensor",
       [&](auto& t) {
         t.push_back({"model.layers.7.mlp.up_proj.weight", {7}, extra});
       },
       {"model.layers.7.mlp.up_proj.weight", "unexpected", "model.safetensors"}},
      {"wrong shape",
       [&](auto& t) {
         for (auto& x : t)
           if (x.name == "model.layers.0.self_attn.o_proj.weight") x = {x.name, {32, 33}, wrong};
       },
       {"model.layers.0.self_attn.o_proj.weight", "[32, 33]", "[32, 32]"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    auto tensors = good;
    c.edit(tensors);
    const std::string d = dir / c.label;
    write_model_dir(d, config, tensors, TensorDtype::kBF16);
    std::string msg = error_of([&] { load_hf_model(d); });
    for (const auto& s : c.must_name)
      EXPECT_NE(msg.find(s), std::string::npos) << "missing '" << s << "' in: " << msg;
  }

  // A tensor of an integer dtype with the right byte layout.
  {
    const std::string d = dir / "int";
    fs::create_directories(d);
    write_file_atomic(d + "/config.json", config);
    auto tensors = good;
    write_safetensors(d + "/model.safetensors", tensors, {});
    // Rewrite one dtype string in place: BF16 -> I16 (same width, so the file stays well formed).
    std::string bytes = testing::read_bytes(d + "/model.safetensors");
    std::size_t at = bytes.find("\"model.norm.weight\":{");
    ASSERT_NE(at, std::string::npos);
    bytes.replace(bytes.find("BF16", at), 4, "I16 ");
    testing::write_bytes(d + "/model.safetensors", bytes);
    std::string msg = error_of([&] { load_hf_model(d); });
    EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("I16"), std::string::npos) << msg;
  }
  // A truncated file and a missing config.
  {
    const std::string d = dir / "trunc";
    write_model_dir(d, config, good, TensorDtype::kBF16);
    fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") - 10);
    std::string msg = error_of([&] { load_hf_model(d); });
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lm_head.weight"), std::string::npos) << msg;  // the last tensor is the one cut
    fs::remove(d + "/config.json");
    EXPECT_THROW(load_hf_model(d), IoError);
  }
}

// Gemma 4's packed experts (3-D tensors) checked against the config: a folder whose experts are
// packed for another expert count or intermediate size is refused naming the tensor and both shapes.
TEST(HfModel, ExpertsPackedDifferentlyFromTheConfigAreRefusedNamingBothShapes) {
  TempDir dir;
  const ModelCard card = model_card_from_yaml(
      "name: moe\nmodel_type: gemma4\nhidden_size: 16\nnum_hidden_layers: 2\nnum_attention_heads: 2\n"
      "num_key_value_heads: 1\nhead_dim: 8\nintermediate_size: 20\nvocab_size: 48\n"
      "layer_types: [sliding_attention, full_attention]\nsliding_window: 4\nglobal_head_dim: 16\n"
      "num_experts: 8\nnum_experts_per_tok: 2\nmoe_intermediate_size: 6\nfinal_logit_softcapping: 30.0\n",
      "moe");
  const ModelLayout layout = make_model_layout(card);
  const UnitBuffers units = random_units(layout, 9, true);
  save_hf_model(dir / "good", card, unit_spans(units));
  const HfModel back = load_hf_model(dir / "good");  // the writer's folder loads, names and all
  EXPECT_TRUE(bitwise_equal(back.units, units));
  const nlohmann::json config = nlohmann::json::parse(testing::read_bytes(dir / "good/config.json"));
  const nlohmann::json& text = config.contains("text_config") ? config["text_config"] : config;
  ASSERT_EQ(text.at("num_experts"), 8);
  struct Case {
    const char* key;
    int value;
    const char* tensor;
    const char* have;
    const char* want;
  };
  for (const Case& c : {Case{"moe_intermediate_size", 3, "model.language_model.layers.0.experts.gate_up_proj",
                             "[8, 12, 16]", "[8, 6, 16]"},
                        Case{"num_experts", 4, "model.language_model.layers.0.router.proj.weight", "[8, 16]",
                             "[4, 16]"}}) {
    SCOPED_TRACE(c.key);
    const fs::path d = dir / c.key;
    fs::create_directories(d);
    fs::copy_file(dir / "good/model.safetensors", d / "model.safetensors");
    nlohmann::json edited = config;
    (edited.contains("text_config") ? edited["text_config"] : edited)[c.key] = c.value;
    write_file_atomic(d / "config.json", edited.dump(2));
    const std::string msg = error_of([&] { load_hf_model(d); });
    for (const char* s : {c.tensor, c.have, c.want, "model.safetensors"})
      EXPECT_NE(msg.find(s), std::string::npos) << "missing '" << s << "' in: " << msg;
  }
}

TEST(HfModel, IgnoresOldRotaryInvFreqBuffers) {
  TempDir dir;
  ModelCard card = tiny_card("llama");
  ModelLayout layout = make_model_layout(card);
  UnitBuffers units = random_units(layout, 6, true);
  auto tensors = unit_tensors_to_write(layout, unit_spans(units), "");
  std::vector<float> inv_freq(4, 0.5f);
  tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {4}, inv_freq});
  write_model_dir(dir / "old", tiny_config_json("llama", false), tensors, TensorDtype::kBF16);
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "old").units, units));
}

TEST(HfModel, SaveIsAtomicAndCarriesTokenizerFiles) {
  TempDir dir;
  ModelCard card = tiny_card("llama");
  ModelLayout layout = make_model_layout(card);
  UnitBuffers a = random_units(layout, 7, true), b = random_units(layout, 8, true);
  save_hf_model(dir / "m", card, unit_spans(a));
  testing::write_bytes(dir / "m/tokenizer.json", "{\"tok\": 1}");
  EXPECT_THROW(save_hf_model(dir / "m", card, unit_spans(b)), IoError);  // exists, not empty
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "m").units, a));         // untouched

  HfSaveOptions opt;
  opt.overwrite = true;
  opt.max_shard_bytes = 4096;  // sharded now: the old model.safetensors must not linger
  save_hf_model(dir / "m", card, unit_spans(b), opt);
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "m").units, b));
  EXPECT_FALSE(fs::exists(dir / "m/model.safetensors"));
  EXPECT_EQ(testing::read_bytes(dir / "m/tokenizer.json"), "{\"tok\": 1}");

  HfSaveOptions copy;
  copy.copy_extra_files_from = dir / "m";
  save_hf_model(dir / "n", card, unit_spans(a), copy);
  EXPECT_EQ(testing::read_bytes(dir / "n/tokenizer.json"), "{\"tok\": 1}");
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "n").units, a));

  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << "temp folder left: " << e.path();
  // Wrong buffer sizes are refused before anything is written.
  UnitBuffers short_units = a;
  short_units[1].pop_back();
  EXPECT_THROW(save_hf_model(dir / "bad", card, unit_spans(short_units)), InputError);
  EXPECT_FALSE(fs::exists(dir / "bad"));
}

// A save abandoned by its poll (slidedp-run's second signal) leaves the destination as it was and no
// temp folder; the poll is called while a tensor is written, not only between files (a one-shard
// model would otherwise be written whole first).
TEST(HfModel, APollThatThrowsAbandonsTheSave) {
  TempDir dir;
  // A 8192 x 32 embedding spans several of the writer's 65536-element blocks.
  const ModelCard card = tiny_card("llama", false, 2, 8192);
  const ModelLayout layout = make_model_layout(card);
  const UnitBuffers a = random_units(layout, 10, true), b = random_units(layout, 11, true);
  save_hf_model(dir / "m", card, unit_spans(a));
  struct Stop {};
  int calls = 0;
  HfSaveOptions opt;
  opt.overwrite = true;
  opt.poll = [&] {
    if (++calls == 3) throw Stop{};
  };
  EXPECT_THROW(save_hf_model(dir / "m", card, unit_spans(b), opt), Stop);
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "m").units, a));  // untouched
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << "temp folder left: " << e.path();
  // A poll that never throws is called more than once per tensor for the large ones.
  calls = 0;
  opt.poll = [&] { ++calls; };
  save_hf_model(dir / "m", card, unit_spans(b), opt);
  EXPECT_GT(calls, static_cast<int>(unit_tensors_to_write(layout, unit_spans(b), "").size()));
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "m").units, b));
}

// A save killed before its rename leaves ".tmp-<name>-<pid>-<n>" beside the target; the next save of
// that target removes it once its writer is gone, and leaves a live writer's folder and other targets'
// temp folders alone.
TEST(HfModel, TheNextSaveCleansTheTempFolderOfAKilledSave) {
  TempDir dir;
  const ModelCard card = tiny_card("llama");
  const UnitBuffers units = random_units(make_model_layout(card), 9, true);
  pid_t dead = ::fork();  // a process that has exited and been reaped: its pid is free
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string pid = std::to_string(dead), me = std::to_string(::getpid());
  fs::create_directories(dir / (".tmp-m-" + pid + "-0"));
  testing::write_bytes(dir / (".tmp-m-" + pid + "-0/model.safetensors"), "half written");
  fs::create_directories(dir / (".tmp-m-" + me + "-99"));     // a live writer (this process)
  fs::create_directories(dir / (".tmp-other-" + pid + "-0"));  // another target's
  save_hf_model(dir / "m", card, unit_spans(units));
  EXPECT_FALSE(fs::exists(dir / (".tmp-m-" + pid + "-0")));
  EXPECT_TRUE(fs::exists(dir / (".tmp-m-" + me + "-99")));
  EXPECT_TRUE(fs::exists(dir / (".tmp-other-" + pid + "-0")));
  EXPECT_TRUE(bitwise_equal(load_hf_model(dir / "m").units, units));
}

// The independent checker (standard-library Python, written from the spec) on our sharded output:
// it must accept it and report the same tensors, dtypes, shapes and offsets our reader sees; and it
// must reject a truncated shard (so this test can fail).
TEST(HfModel, IndependentPythonCheckerAcceptsOurFiles) {
  if (!fs::exists("/usr/bin/python3"))
    GTEST_SKIP() << "/usr/bin/python3 not found: independent check skipped";
  TempDir dir;
  ModelCard card = tiny_card("qwen2", false, 2);
  ModelLayout layout = make_model_layout(card);
  UnitBuffers units = random_units(layout, 9, true);
  HfSaveOptions opt;
  opt.max_shard_bytes = 6000;
  save_hf_model(dir / "m", card, unit_spans(units), opt);

  auto r = testing::run_command(std::string("/usr/bin/python3 ") + SLIDEDP_CHECK_SAFETENSORS_PY +
                                " --json --check-finite " + (dir / "m"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto report = nlohmann::json::parse(r.output);
  ASSERT_TRUE(report["errors"].empty()) << r.output;
  const auto& result = report["results"][dir / "m"];
  SafetensorsSet ours = SafetensorsSet::open_model_dir(dir / "m");
  std::size_t seen = 0;
  for (const auto& [shard, info] : result["shards"].items())
    for (const auto& [name, t] : info["tensors"].items()) {
      auto ref = ours.find(name);
      ASSERT_TRUE(ref.has_value()) << name;
      EXPECT_EQ(t["dtype"], "BF16");
      EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), ref->entry->shape) << name;
      EXPECT_EQ(t["data_offsets"][0].get<uint64_t>(), ref->entry->begin) << name;
      EXPECT_EQ(t["data_offsets"][1].get<uint64_t>(), ref->entry->end) << name;
      EXPECT_NE(ref->file->path().find(shard), std::string::npos) << name;
      ++seen;
    }
  EXPECT_EQ(seen, ours.all().size());

  const std::string second =
      dir / "m/model-00002-of-" + fmt::format("{:05d}", result["shards"].size()) + ".safetensors";
  fs::resize_file(second, fs::file_size(second) - 2);
  r = testing::run_command(std::string("/usr/bin/python3 ") + SLIDEDP_CHECK_SAFETENSORS_PY + " " +
                           (dir / "m"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("model-00002"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace slidedp
