// The validation corpus (sweeps/specs/validation.yaml) and its sweep: every entry of the committed
// corpus parses and is predicted; the unit conversions against closed forms; bad entries are refused
// naming the entry and the field; and the model's error on the corpus does not regress past the
// committed figure (results/validation/summary.json) by more than 2 points.
#include "sweeps/validation.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/error.h"

namespace slidedp {
namespace {

const char* kCorpus = R"(name: v
machines:
  - label: h100
    preset: h100-sxm-x4
points:
  - id: A
    source: "a test"
    reading: exact
    machine: h100
    system: megatrain
    model: qwen2.5-7b
    precision: bf16
    seq_len: 1024
    ranks: 1
    micro_batch: 8
    accum: 1
    activation_checkpointing: full
    measured: {tflops_per_gpu: 100, flop_formula: 6n}
    use: core
)";

std::string error_of(const std::string& text) {
  try {
    validation_corpus_from_yaml(text, "corpus.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

std::string edited(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

// TFLOPS become tokens/s by the formula the source states: 6N per token, or Megatron's
// 96 L h^2 (1 + s/6h + V/16Lh) with recompute (Narayanan et al. 2021, eq. 3 divided by the batch's tokens).
TEST(Validation, MeasuredFiguresConvertToTheJobsTokensPerSecond) {
  const ValidationCorpus c = validation_corpus_from_yaml(kCorpus, "corpus.yaml");
  const ValidationPoint& p = c.points.front();
  EXPECT_DOUBLE_EQ(measured_tokens_per_s(p), 100e12 / (6.0 * static_cast<double>(p.card.total_params())));
  ModelCard g;
  g.num_layers = 50, g.hidden_size = 4096, g.vocab_size = 50257;
  const double megatron = 96.0 * 50 * 4096.0 * 4096.0 * (1 + 1024.0 / (6 * 4096) + 50257.0 / (16 * 50 * 4096.0));
  EXPECT_DOUBLE_EQ(flops_per_token(g, 1024, "megatron"), megatron);
  ValidationPoint q = p;
  q.ranks = 4, q.micro_batch = 2, q.accum = 3;
  q.measured = {"step_time_s", 2.0, ""};
  EXPECT_DOUBLE_EQ(measured_tokens_per_s(q), 4.0 * 2 * 3 * 1024 / 2.0);
  q.measured = {"tokens_per_s_per_gpu", 500, ""};
  EXPECT_DOUBLE_EQ(measured_tokens_per_s(q), 2000);
}

TEST(Validation, AnEntryTheModelCannotPredictIsRefusedNamingTheEntryAndField) {
  struct Case {
    std::string from, to, must_say;
  };
  for (const Case& c : {Case{"model: qwen2.5-7b", "model: no-such-model", "points[0].model"},
                        Case{"system: megatrain", "system: deepspeed", "unknown system 'deepspeed'"},
                        Case{"machine: h100", "machine: a100", "points[0].machine: 'a100' is not a label"},
                        Case{"    seq_len: 1024\n", "", "points[0].seq_len: missing required key (point A)"},
                        Case{"measured: {tflops_per_gpu: 100, flop_formula: 6n}", "measured: {tflops_per_gpu: 100}",
                             "flop_formula"},
                        Case{"measured: {tflops_per_gpu: 100, flop_formula: 6n}", "measured: {}", "measured figure"},
                        Case{"source: \"a test\"", "source: \"\"", "source"}}) {
    SCOPED_TRACE(c.to);
    const std::string e = error_of(edited(kCorpus, c.from, c.to));
    EXPECT_NE(e.find("corpus.yaml"), std::string::npos) << e;
    EXPECT_NE(e.find(c.must_say), std::string::npos) << e;
  }
}

// The committed corpus: the issue's floor (20 points, 4 sources, 3 GPU types, 4 systems), every point
// predicted, and the mean error no more than 2 points above the committed run's.
TEST(Validation, TheCommittedCorpusIsPredictedAndItsErrorDoesNotRegress) {
  const ValidationCorpus c = load_validation_corpus("sweeps/specs/validation.yaml");
  std::set<std::string> systems, gpus, sources;
  for (const ValidationPoint& p : c.points) {
    systems.insert(system_name(p.system));
    sources.insert(p.source.substr(0, p.source.find_first_of(",(")));
  }
  for (const HardwareVariant& m : c.machines) gpus.insert(m.hw.gpu.model);
  EXPECT_GE(c.points.size(), 20u);
  EXPECT_GE(sources.size(), 4u);
  EXPECT_GE(gpus.size(), 3u);
  EXPECT_GE(systems.size(), 4u);
  const ValidationResult r = run_validation(c);
  std::ifstream in("results/validation/summary.json");
  ASSERT_TRUE(in.good()) << "results/validation/summary.json: run slidedp-sweep validation and commit it";
  const nlohmann::json committed = nlohmann::json::parse(in);
  EXPECT_LE(r.held_out.mean_abs_error, committed["held_out"]["mean_abs_error"].get<double>() + 0.02)
      << "the model's mean error on the corpus' held-out runs regressed";
  EXPECT_EQ(r.all.points, committed["all"]["points"].get<int>()) << "the corpus changed: rerun and commit the result";
}

}  // namespace
}  // namespace slidedp
