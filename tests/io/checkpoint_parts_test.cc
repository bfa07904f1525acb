// Checkpoints written in parts (one writer per node of a sharded state): the split is contiguous and
// balanced, parts written by separate writers load bitwise like the one-file checkpoint of the same
// state, the folder loads as a Hugging Face sharded model, any element range of any unit reads back
// as the whole state's slice, and a missing part is refused naming the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "common/error.h"
#include "io/checkpoint.h"
#include "io/hf_model.h"
#include "io_test_util.h"

namespace slidedp {
namespace {

namespace fs = std::filesystem;
using testing::bitwise_equal;
using testing::random_units;
using testing::TempDir;
using testing::tiny_card;

struct Whole {
  ModelCard card;
  ModelLayout layout;
  UnitBuffers master, m, v;
  TrainerState state;
  CheckpointData view() const { return {card, unit_spans(master), unit_spans(m), unit_spans(v), state}; }
};

Whole make_whole(const ModelCard& card) {
  Whole w;
  w.card = card;
  w.layout = make_model_layout(card);
  w.master = random_units(w.layout, 1, false);
  w.m = random_units(w.layout, 2, false);
  w.v = random_units(w.layout, 3, false);
  for (auto& u : w.v)
    for (auto& x : u) x = x * x;
  w.state.optimizer_step = 7;
  w.state.adamw_step = 7;
  w.state.lr_schedule_step = 7;
  w.state.learning_rate = 1e-3;
  w.state.data_cursor = {0, 28, 100, 64, 42};
  return w;
}

// What each writer of a part would pass: views of its tensors, in layout order.
std::vector<TensorStateView> part_views(const Whole& w, const TensorSplit& split, int part) {
  std::vector<TensorStateView> out;
  for (size_t u = 0; u < w.layout.units.size(); ++u)
    for (size_t t = 0; t < w.layout.units[u].tensors.size(); ++t) {
      if (split.part_of[u][t] != part) continue;
      const TensorSpec& s = w.layout.units[u].tensors[t];
      const size_t o = static_cast<size_t>(s.offset), n = static_cast<size_t>(s.numel);
      out.push_back({std::span<const float>(w.master[u]).subspan(o, n), std::span<const float>(w.m[u]).subspan(o, n),
                     std::span<const float>(w.v[u]).subspan(o, n)});
    }
  return out;
}

// The three steps of a multi-writer save, the writers taking turns in one process.
std::string save_in_parts(const Whole& w, const std::string& root, int parts) {
  const TensorSplit split = split_tensors_evenly(w.layout, parts);
  const std::string tmp = begin_checkpoint(root, w.state);
  for (int p = parts - 1; p >= 0; --p)  // any order: each writer only writes its own files
    write_checkpoint_part(tmp, w.layout, split, p, part_views(w, split, p), w.state.optimizer_step);
  return finish_checkpoint(tmp, root, w.card, split, w.state, 0);
}

TEST(CheckpointParts, TheSplitIsContiguousBalancedAndCoversEveryTensor) {
  const ModelLayout layout = make_model_layout(tiny_card("llama", false, /*layers=*/6, /*vocab=*/512));
  int64_t total = 0, largest = 0;
  for (const auto& u : layout.units)
    for (const auto& t : u.tensors) total += t.numel, largest = std::max(largest, t.numel);
  for (int parts = 1; parts <= 9; ++parts) {
    SCOPED_TRACE(parts);
    const TensorSplit split = split_tensors_evenly(layout, parts);
    std::vector<int64_t> size(static_cast<size_t>(parts));
    int previous = 0;
    ASSERT_EQ(split.part_of.size(), layout.units.size());
    for (size_t u = 0; u < layout.units.size(); ++u) {
      ASSERT_EQ(split.part_of[u].size(), layout.units[u].tensors.size());
      for (size_t t = 0; t < layout.units[u].tensors.size(); ++t) {
        const int p = split.part_of[u][t];
        ASSERT_GE(p, previous) << "parts must be contiguous in layout order";
        ASSERT_LT(p, parts);
        previous = p;
        size[static_cast<size_t>(p)] += layout.units[u].tensors[t].numel;
      }
    }
    // A tensor goes where its middle element falls: no part exceeds its share by more than one tensor.
    for (int64_t s : size) EXPECT_LE(s, total / parts + largest);
  }
}

TEST(CheckpointParts, PartsBySeparateWritersLoadBitwiseLikeOneFile) {
  TempDir root;
  const Whole w = make_whole(tiny_card("qwen3", true, /*layers=*/4, /*vocab=*/256));
  const LoadedCheckpoint one = load_checkpoint(save_checkpoint(root / "one", w.view(), 0));
  for (int parts : {2, 3, 24}) {  // 24: the embedding outweighs a part, so some parts are empty
    SCOPED_TRACE(parts);
    const std::string dir = save_in_parts(w, root / std::to_string(parts), parts);
    EXPECT_TRUE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(fs::path(dir) / "optimizer.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(fs::path(dir) / "model.safetensors"));
    const TensorSplit split = split_tensors_evenly(w.layout, parts);
    EXPECT_TRUE(fs::exists(fs::path(dir) / split.file("model", parts - 1)));
    int files = 0;
    for (int p = 0; p < parts; ++p) files += fs::exists(fs::path(dir) / split.file("model", p)) ? 1 : 0;
    if (parts == 24) {
      EXPECT_LT(files, parts) << "the case of an empty part is not exercised";
    }
    const LoadedCheckpoint ck = load_checkpoint(dir);
    EXPECT_TRUE(bitwise_equal(ck.master, one.master));
    EXPECT_TRUE(bitwise_equal(ck.adam_m, one.adam_m));
    EXPECT_TRUE(bitwise_equal(ck.adam_v, one.adam_v));
    EXPECT_EQ(ck.state, one.state);
    // A Hugging Face sharded model folder: the weights load through the index.
    EXPECT_TRUE(bitwise_equal(load_hf_model(dir).units, w.master));
  }
}

TEST(CheckpointParts, TheReaderReadsAnyRangeOfAnyUnit) {
  TempDir root;
  const Whole w = make_whole(tiny_card("llama", false, 3, 128));
  const CheckpointReader reader(save_in_parts(w, root.path(), 3));
  std::mt19937_64 rng(5);
  using Part = CheckpointReader::Part;
  for (int trial = 0; trial < 200; ++trial) {
    const int u = static_cast<int>(rng() % w.layout.units.size());
    const int64_t n = w.layout.units[static_cast<size_t>(u)].flat_numel;
    int64_t b = static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1)), e = static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1));
    if (b > e) std::swap(b, e);
    for (auto [part, whole] : {std::pair{Part::kMaster, &w.master}, std::pair{Part::kExpAvg, &w.m},
                               std::pair{Part::kExpAvgSq, &w.v}}) {
      std::vector<float> got(static_cast<size_t>(e - b), -1.0f);
      reader.read(part, u, b, e, got.data());
      const std::vector<float>& unit = (*whole)[static_cast<size_t>(u)];
      ASSERT_TRUE(std::equal(got.begin(), got.end(), unit.begin() + b)) << "unit " << u << " [" << b << ", " << e << ")";
    }
  }
}

TEST(CheckpointParts, AMissingPartIsRefusedNamingTheFile) {
  TempDir root;
  const Whole w = make_whole(tiny_card("llama", false, 2, 64));
  const std::string dir = save_in_parts(w, root.path(), 2);
  const std::string gone = split_tensors_evenly(w.layout, 2).file("optimizer", 1);
  fs::remove(fs::path(dir) / gone);
  try {
    load_checkpoint(dir);
    FAIL() << "loaded a checkpoint without " << gone;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(gone), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace slidedp
