// Training checkpoints: everything a bit-exact resume needs, as plain data (the executor owns the live
// state). Layout: <root>/step-00000123/ with config.json + model.safetensors (fp32 master weights under
// Hugging Face names, so HF tools load the folder as a model), optimizer.safetensors (AdamW m and v as
// "<name>.exp_avg" / "<name>.exp_avg_sq", fp32) and trainer_state.json (steps, data cursor, RNG,
// free metadata). A checkpoint is written into a temp folder, every file fsynced, renamed into place
// and the root fsynced: a folder named step-* is always complete, and a writer killed mid-way leaves
// only a .tmp-* folder that the next save removes.
// A state sharded across nodes is written by every node into the one folder, in parts: the tensors are
// split into P contiguous groups (layout order, balanced by size), group p's weights go to
// model-<p+1>-of-<P>.safetensors and its moments to optimizer-<p+1>-of-<P>.safetensors, and
// model.safetensors.index.json / optimizer.safetensors.index.json map every name to its file (the
// Hugging Face sharded layout, so the folder still loads as a model, with no consolidation step). A
// reader takes any element range of any unit (CheckpointReader), so a checkpoint resumes on any node
// count and placement, each node reading only what it holds.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "io/sequence_sampler.h"
#include "io/unit_tensors.h"
#include "model/plan.h"

namespace slidedp {

struct TrainerState {
  int64_t optimizer_step = 0;        // optimizer steps taken, skipped ones included (names the folder)
  int64_t adamw_step = -1;           // AdamW updates applied (bias correction): optimizer_step minus the
                                     // skipped steps; -1 in files written before the key existed, read
                                     // as optimizer_step (no step could be skipped then without it)
  int64_t lr_schedule_step = 0;      // position in the learning-rate schedule
  double learning_rate = 0.0;        // the rate of the last step (informational; restored bit-exactly)
  std::string lr_schedule_json;      // the run's schedule as a JSON object ("" if not recorded), so a
                                     // resumed run continues the same schedule
  DataCursor data_cursor;            // where the next step's data starts
  std::vector<uint64_t> rng_state;   // any generator words (dropout, sampling), restored verbatim
  // How the run held AdamW's moments ("fp32", "bf16" or "8bit"; the files hold them in fp32 either way,
  // bf16 ones widened exactly, 8-bit ones decoded). Written only when not fp32, so older readers take
  // the other checkpoints.
  OptimizerStates optimizer_states = OptimizerStates::kFp32;
  std::string metadata_json = "{}";  // any JSON value (plan, hardware, run configuration); stored as
                                     // JSON and returned compact with key order kept
  bool operator==(const TrainerState&) const = default;
};

// What save_checkpoint writes. The spans point at the caller's state: one buffer per unit of
// make_model_layout(card), flat_numel elements each, padding zero.
struct CheckpointData {
  ModelCard card;
  UnitSpans master;  // fp32 master weights
  UnitSpans adam_m;  // AdamW first moment
  UnitSpans adam_v;  // AdamW second moment
  TrainerState state;
};

struct LoadedCheckpoint {
  std::string dir;
  ModelCard card;
  ModelLayout layout;
  UnitBuffers master, adam_m, adam_v;  // [unit] -> (flat_numel,) fp32, padding zero
  TrainerState state;
  CheckpointData view() const;  // spans into this object (e.g. to save it again)
};

// Called after each file of a checkpoint is complete and fsynced (file name inside the step folder);
// for progress reporting, and for tests that stop a writer at a known point.
using CheckpointFileHook = std::function<void(const std::string& file_name)>;

// "step-00000123"
std::string checkpoint_dir_name(int64_t step);

// One tensor's state as a writer of a part passes it (numel elements each).
struct TensorStateView {
  std::span<const float> master, m, v;
};

// Writing in parts, by several processes sharing the folder (save_checkpoint is the one-process case):
// 1. one process: checks `state`, creates root_dir, removes dead writers' temp folders, and returns the
//    temp folder every writer writes into;
std::string begin_checkpoint(const std::string& root_dir, const TrainerState& state);
// 2. every writer of a part: its two files, fsynced. `tensors` holds the part's tensors in layout
//    order; when every view leaves master (or m and v) empty, that file is not written, so a writer
//    short of memory writes the two files in two calls. Throws NumericError for a value no AdamW step makes (the checkpoint must then be
//    abandoned), IoError for a failed write;
void write_checkpoint_part(const std::string& tmp_dir, const ModelLayout& layout, const TensorSplit& split,
                           int part, std::span<const TensorStateView> tensors, int64_t step,
                           const CheckpointFileHook& on_file_written = {});
// 3. the process of step 1, once every part is written: config.json, the indexes (more than one part)
//    and trainer_state.json, then the folder is published and older checkpoints rotated as
//    save_checkpoint says. Returns the checkpoint folder.
std::string finish_checkpoint(const std::string& tmp_dir, const std::string& root_dir, const ModelCard& card,
                              const TensorSplit& split, const TrainerState& state, int keep_last,
                              const CheckpointFileHook& on_file_written = {});
// Instead of 3 after a failure: removes the temp folder.
void abandon_checkpoint(const std::string& tmp_dir);

// A checkpoint folder opened for reading any part of its state: config.json, trainer_state.json and
// every tensor's presence, shape and dtype (fp32) are checked on opening; values as they are read.
class CheckpointReader {
 public:
  enum class Part { kMaster, kExpAvg, kExpAvgSq };
  explicit CheckpointReader(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const ModelCard& card() const { return card_; }
  const ModelLayout& layout() const { return layout_; }
  const TrainerState& state() const { return state_; }
  // Elements [begin, end) of unit u's flat buffer (padding zero). Throws InputError naming the file,
  // the tensor and the element for a value no training step writes (not finite; a negative second
  // moment). Thread-safe.
  void read(Part part, int u, int64_t begin, int64_t end, float* out) const;

 private:
  std::string dir_;
  ModelCard card_;
  ModelLayout layout_;
  TrainerState state_;
  SafetensorsSet model_, optimizer_;
  UnitTensorRefs found_[3];
};

// Writes <root_dir>/step-<optimizer_step>/ atomically (replacing a checkpoint of the same step), then
// keeps it and the newest keep_last - 1 other checkpoints, deleting the rest (keep_last <= 0 keeps
// all), and removes temp folders left by dead writers (run before writing). Returns the checkpoint folder.
// Throws InputError for buffers of the wrong size or non-zero padding, IoError for failed writes (the temp
// folder is removed).
std::string save_checkpoint(const std::string& root_dir, const CheckpointData& data, int keep_last,
                            const CheckpointFileHook& on_file_written = {});

// Reads and validates a whole checkpoint folder, written in one part or several (every tensor present,
// fp32, right shape; trainer_state.json strict). Throws InputError / IoError naming the file and the
// tensor or key.
LoadedCheckpoint load_checkpoint(const std::string& dir);

// Only trainer_state.json of a checkpoint folder (cheap: no tensors), validated like load_checkpoint.
TrainerState load_trainer_state(const std::string& dir);

// A checkpoint folder itself, or the newest complete one under a checkpoint root. Throws IoError naming
// `path` when it is neither.
std::string resolve_checkpoint_dir(const std::string& path);

// Complete checkpoints under root_dir, oldest first: (step, folder). Temp folders are not listed.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root_dir);

// The newest complete checkpoint folder, or nullopt when there is none (or root_dir does not exist).
std::optional<std::string> find_latest_checkpoint(const std::string& root_dir);

}  // namespace slidedp
