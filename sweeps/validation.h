// The model against the world: a corpus of published, measured training runs (sweeps/specs/
// validation.yaml: source, machine, system, model, batch shape, what was measured), each predicted by
// the step model with the matching --system and hardware, and the error per point, per system and
// in all, and whether the model orders the systems on each machine as the measurements do.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "model/plan.h"
#include "model/system.h"
#include "sweeps/sweep_spec.h"

namespace slidedp {

// What a source measured, in its own unit, and how it becomes the job's tokens per second.
struct MeasuredFigure {
  std::string unit;         // tokens_per_s | tokens_per_s_per_gpu | step_time_s | tflops_per_gpu
  double value = 0;
  std::string flop_formula;  // tflops_per_gpu: "megatron" | "6n"
};

struct ValidationPoint {
  std::string id, source, reading, assumed, use;  // reading: exact | plot | derived; use: core | supplementary
  // A run that set something the predictions use, reported apart from the rest: "compute" (a GPU-
  // resident run that sets its GPU's training compute rate, below) or "preset" (a preset's rate came
  // from its source); "" for a held-out run.
  std::string calibration;
  bool calibrates_compute() const { return calibration == "compute"; }
  double reading_tolerance = 0;
  std::string machine;  // a label of ValidationCorpus::machines
  System system = System::kSlideDP;
  std::string model_ref;  // as written (preset name or card path)
  ModelCard card;
  std::string precision;  // fp16 | bf16
  int64_t seq_len = 0;
  int ranks = 1, micro_batch = 1, accum = 1;
  std::string activation_checkpointing;  // full | selective | none
  MeasuredFigure measured;
  std::string where;  // "file: points[i]" for messages
};

struct ValidationCorpus {
  std::string name, description, file, text;
  uint64_t text_hash = 0;
  std::vector<HardwareVariant> machines;
  std::vector<ValidationPoint> points;
};

// Reads and checks a corpus; an entry naming an unknown model, system or machine, or lacking a field
// the prediction needs, is an InputError naming the entry (its id) and the field.
ValidationCorpus load_validation_corpus(const std::string& path);
ValidationCorpus validation_corpus_from_yaml(const std::string& text, const std::string& origin);

// The job's measured tokens per second (tflops_per_gpu converted with the point's FLOP formula).
double measured_tokens_per_s(const ValidationPoint& p);
// FLOPs per token of a formula the sources use: "megatron" (Narayanan et al.: forward, backward and
// the recomputed forward, 96 L h^2 (1 + s/6h + V/16Lh)) or "6n" (6 x parameters).
double flops_per_token(const ModelCard& card, int64_t seq_len, const std::string& formula);
// The plan a point ran: its ranks and batch shape, its activation checkpointing over every layer.
Plan validation_plan(const ValidationPoint& p);

struct ValidationRow {
  const ValidationPoint* point = nullptr;
  double measured_tokens_per_s = 0;
  double predicted_tokens_per_s = 0;  // 0 when the model calls the run infeasible
  bool feasible = true;
  std::string infeasible_reason;      // the model's first reason
  double error = 0;                   // predicted / measured - 1 (positive: the model is optimistic)
  std::string bottleneck;
  double predicted_step_s = 0, measured_step_s = 0;
};

// Systems on one machine at one workload (machine, model, sequence, ranks, tokens per step): the
// measured order and whether the model's order is the same.
struct RankingGroup {
  std::string key;
  std::vector<std::string> measured_order, predicted_order;  // fastest first, "system (id)"
  bool right = true;
};

struct ValidationSummary {
  int points = 0, predicted = 0, infeasible = 0;
  double mean_abs_error = 0, median_abs_error = 0, worst_abs_error = 0;
  std::string worst_id;
  double mean_signed_error = 0;  // > 0: optimistic on average
};

// What the calibration runs say of one GPU model: the factor on the preset's matmul and attention
// efficiencies (measured from kernel benchmarks) that makes its GPU-resident runs' mean log error 0.
struct ComputeCalibration {
  std::string gpu_model;
  double scale = 1;
  std::vector<std::string> from;  // the points' ids
};

struct ValidationResult {
  ValidationCorpus corpus;
  std::vector<ComputeCalibration> calibrations;
  ValidationSummary calibration, held_out;  // the calibration runs; every other run
  std::vector<ValidationRow> rows;
  std::vector<RankingGroup> rankings;
  ValidationSummary all, core;
  std::vector<std::pair<std::string, ValidationSummary>> by_system;
};

ValidationResult run_validation(const ValidationCorpus& corpus);

// README.md, points.csv and predicted_vs_measured.svg into `dir` (created; other files kept).
std::vector<std::string> write_validation_report(const ValidationResult& r, const std::string& dir,
                                                 const std::string& command);

}  // namespace slidedp
