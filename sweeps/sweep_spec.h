// A sweep spec: grids of hardware x models x sequence lengths x batches x ranks x systems, read from
// strict YAML (unknown keys and bad values are errors naming the file and key path), plus the
// analyses to run on the results and the paper's claims to set beside them. Hardware entries are a
// preset with what-if overrides merged onto its YAML, so every override is checked by the same reader
// that checks presets and must name a key the preset has.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "common/hash.h"
#include "common/yaml_reader.h"
#include "model/hardware.h"
#include "model/plan.h"
#include "model/system.h"

namespace slidedp {

// One machine of a sweep: a preset (or profile file) with overrides applied.
struct HardwareVariant {
  std::string label;                   // unique within the sweep: "h100-sxm-x4", "host mem 200 GB/s"
  std::string base;                    // the preset name or file it starts from
  std::vector<std::string> overrides;  // "host.mem_bw_gbps=200", in the order applied (for reports)
  Hardware hw;
};

// How a grid states its batch: tokens per optimizer step (matched batch, strong scaling) or
// sequences per rank per step (weak scaling, long context: the step grows with ranks and seq_len).
enum class BatchMode { kTokensPerStep, kSequencesPerRank };

struct SweepGrid {
  std::string name;  // "h100-x4"; defaults to grid<i>
  std::vector<HardwareVariant> hardware;
  std::vector<ModelCard> models;
  std::vector<int64_t> seq_lens;
  BatchMode batch_mode = BatchMode::kTokensPerStep;
  std::vector<int64_t> batch_values;  // tokens per step, or sequences per rank
  std::vector<int> ranks;             // empty: every GPU of each hardware variant (per node)
  std::vector<int> nodes{1};          // nodes like the hardware variant (SlideDP only when > 1)
  std::vector<System> systems;
  // MoE what-if (model/workload.h): deliver only the experts each micro-batch routes to, under a
  // router of this Zipf skew. Whole grids, so a study sets "all" and "routed" side by side.
  bool expert_aware_delivery = false;
  double router_skew = 0.0;
  // SlideDP's AdamW moments on the host, and whether the run clips (the update after the backward,
  // Plan::verify_updates): whole grids, so a study sets formats side by side. SlideDP only.
  OptimizerStates optimizer_states = OptimizerStates::kFp32;
  bool clip = false;
};

// Analyses a spec may ask for (sweep_analysis.h).
inline constexpr const char* kAnalysisThroughput = "throughput";             // tokens/s vs tokens per step
inline constexpr const char* kAnalysisSpeedups = "speedups";                 // SlideDP over each baseline
inline constexpr const char* kAnalysisBottlenecks = "bottlenecks";           // binding resource, route
inline constexpr const char* kAnalysisLongestSequence = "longest_sequence";  // longest seq_len that fits
inline constexpr const char* kAnalysisScaling = "scaling";                   // weak/strong vs ranks
inline constexpr const char* kAnalysisComputeBound = "compute_bound";        // where compute hides streaming
std::vector<std::string> analysis_names();

// Metrics a paper claim can be compared with (sweep_analysis.cc computes them).
std::vector<std::string> claim_metric_names();

// A statement of the paper, the metric of this sweep it corresponds to, and filters that select the
// rows the metric is computed over (empty = all).
struct PaperClaim {
  std::string claim;                   // what the paper says, in words
  std::string paper;                   // the paper's number as it states it ("1.46-2.64x")
  std::string metric;                  // one of claim_metric_names()
  std::string hardware, model;         // filters: hardware label, model name
  std::vector<std::string> baselines;  // speedup metrics: which baselines (empty: every one swept)
  int64_t min_tokens_per_step = 0;     // fsdp2_peak_excess: SlideDP's points at or above this size
};

struct SweepSpec {
  std::string name;
  std::string description;
  std::string file;        // path it was read from ("" for a string)
  std::string text;        // the spec as written (copied into every report)
  uint64_t text_hash = 0;  // FNV-1a of text, printed as 16 hex digits
  bool simulate = false;   // re-score every chosen plan with the discrete-event simulator
  std::vector<std::string> analyses;
  std::vector<PaperClaim> claims;
  std::vector<SweepGrid> grids;
};

// One point to evaluate.
struct SweepPoint {
  int grid = 0;
  int hardware = 0;  // index into grids[grid].hardware
  int model = 0;     // index into grids[grid].models
  int64_t seq_len = 0;
  int ranks = 1;             // per node
  int nodes = 1;
  int64_t batch_value = 0;  // as the grid states it
  int64_t tokens_per_step = 0;
  System system = System::kSlideDP;
};

// Throws InputError naming `origin` and the key path for anything malformed.
SweepSpec sweep_spec_from_yaml(const std::string& text, const std::string& origin);
// Throws IoError when the file cannot be read. Relative hardware paths resolve against its folder.
SweepSpec load_sweep_spec(const std::string& path);

// Every point in spec order: grid, hardware, model, seq_len, nodes, ranks, batch, system (innermost).
std::vector<SweepPoint> expand_points(const SweepSpec& spec);

// A hardware preset (or file) with overrides: `overrides` is a YAML map merged leaf by leaf onto the
// preset's YAML; each key must exist in the preset. `where` names the spec key in errors.
// One machine entry of a spec (preset or profile, optional overrides, label, optional `vary`): the
// variants it names. Reused by the validation corpus's machines.
std::vector<HardwareVariant> read_hardware_entry(const YamlReader& h, const std::string& spec_dir);

// A preset name or a path: relative paths are resolved against the spec's folder.
std::string resolve_in_spec_dir(const std::string& name, bool is_preset, const std::string& spec_dir);

HardwareVariant make_hardware_variant(const std::string& base, const std::string& overrides_yaml,
                                      const std::string& label, const std::string& where);

std::string hash_hex(uint64_t h);  // 16 lowercase hex digits (of common/hash.h's fnv1a)

}  // namespace slidedp
