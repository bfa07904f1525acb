// Sweep specs: a valid spec expands to the points it names, what-if overrides and `vary` reach the
// hardware (and nothing else changes), and every kind of bad spec is an InputError naming the file
// and the key path. The committed specs in sweeps/specs/ all parse and stay small enough to run.
#include "sweeps/sweep_spec.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"

namespace slidedp {
namespace {

const char* kSpec = R"(name: t
description: a test
analyses: [throughput, speedups]
paper:
  - claim: speedups
    paper: 1.46-2.64x
    metric: speedup_geomean
    baselines: [megatrain]
grids:
  - name: g
    hardware:
      - preset: h100-sxm-x4
      - preset: h100-sxm-x4
        label: gen6
        overrides: {host_link: {h2d_gbps: 110.8, d2h_gbps: 110.4}}
      - preset: h100-sxm-x4
        label: mem {value}
        vary: {key: host.mem_bw_gbps, values: [215, 860], scale_with: [cpu.adamw_params_per_s]}
    models: [qwen3-14b, qwen2.5-7b]
    seq_lens: [4096]
    tokens_per_step: [65536, 131072]
    systems: [slidedp, megatrain]
  - name: weak
    hardware:
      - preset: h100-sxm-x8
    ranks: [1, 2, 8]
    models: [qwen3-8b]
    seq_lens: [2048]
    sequences_per_rank: [4]
    systems: [slidedp]
)";

// Replaces the first occurrence of `from` in the valid spec.
std::string edited(const std::string& from, const std::string& to) {
  std::string s = kSpec;
  const auto pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

// The spec must fail with an InputError whose message contains every one of `parts`.
void expect_error(const std::string& text, const std::vector<std::string>& parts) {
  try {
    sweep_spec_from_yaml(text, "bad.yaml");
    ADD_FAILURE() << "accepted a bad spec; wanted an error naming: "
                  << fmt::format("{}", fmt::join(parts, ", "));
  } catch (const InputError& e) {
    const std::string m = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(m.find(p), std::string::npos) << "message lacks '" << p << "': " << m;
  }
}

TEST(SweepSpec, ValidSpecExpandsToTheNamedPoints) {
  const SweepSpec s = sweep_spec_from_yaml(kSpec, "t.yaml");
  EXPECT_EQ(s.name, "t");
  ASSERT_EQ(s.grids.size(), 2u);
  ASSERT_EQ(s.grids[0].hardware.size(), 4u);  // preset, one override, two vary values
  EXPECT_EQ(s.grids[0].hardware[2].label, "mem 215");
  EXPECT_EQ(s.grids[0].hardware[3].label, "mem 860");
  ASSERT_EQ(s.claims.size(), 1u);
  EXPECT_EQ(s.claims[0].baselines, std::vector<std::string>{"megatrain"});
  const std::vector<SweepPoint> pts = expand_points(s);
  // grid g: 4 machines x 2 models x 1 seq x 1 rank count (all GPUs) x 2 batches x 2 systems; weak: 3 ranks.
  ASSERT_EQ(pts.size(), 4u * 2 * 2 * 2 + 3u);
  EXPECT_EQ(pts[0].ranks, 4);  // no ranks key: every GPU of the machine
  EXPECT_EQ(pts[0].system, System::kSlideDP);
  EXPECT_EQ(pts[1].system, System::kMegaTrain);  // systems vary fastest
  const SweepPoint& last = pts.back();
  EXPECT_EQ(last.ranks, 8);
  EXPECT_EQ(last.tokens_per_step, 4 * 8 * 2048);  // sequences per rank x ranks x seq_len
  EXPECT_EQ(s.text_hash, fnv1a(kSpec));
}

TEST(SweepSpec, OverridesChangeOnlyTheirKeysAndAreRecorded) {
  const SweepSpec s = sweep_spec_from_yaml(kSpec, "t.yaml");
  const Hardware& base = s.grids[0].hardware[0].hw;
  const HardwareVariant& gen6 = s.grids[0].hardware[1];
  EXPECT_DOUBLE_EQ(gen6.hw.link.h2d_gbps, 110.8);
  EXPECT_DOUBLE_EQ(gen6.hw.link.d2h_gbps, 110.4);
  EXPECT_DOUBLE_EQ(gen6.hw.link.h2d_all_gbps, base.link.h2d_all_gbps);
  EXPECT_DOUBLE_EQ(gen6.hw.host.mem_bw_gbps, base.host.mem_bw_gbps);
  EXPECT_EQ(gen6.hw.gpu.count, base.gpu.count);
  EXPECT_EQ(gen6.hw.name, "gen6");
  EXPECT_EQ(gen6.overrides,
            (std::vector<std::string>{"host_link.h2d_gbps=110.8", "host_link.d2h_gbps=110.4"}));
  EXPECT_NE(gen6.hw.sources.at("host_link.h2d_gbps").find("what-if override"), std::string::npos);
  EXPECT_TRUE(s.grids[0].hardware[0].overrides.empty());
}

TEST(SweepSpec, VaryScalesTheNamedTablesInProportion) {
  const SweepSpec s = sweep_spec_from_yaml(kSpec, "t.yaml");
  const Hardware& base = s.grids[0].hardware[0].hw;  // host.mem_bw_gbps 430
  const Hardware& lo = s.grids[0].hardware[2].hw;
  const Hardware& hi = s.grids[0].hardware[3].hw;
  EXPECT_DOUBLE_EQ(lo.host.mem_bw_gbps, 215);
  EXPECT_DOUBLE_EQ(hi.host.mem_bw_gbps, 860);
  ASSERT_EQ(lo.cpu.adamw_params_per_s.size(), base.cpu.adamw_params_per_s.size());
  for (std::size_t i = 0; i < base.cpu.adamw_params_per_s.size(); ++i) {
    EXPECT_EQ(lo.cpu.adamw_params_per_s[i].threads, base.cpu.adamw_params_per_s[i].threads);
    EXPECT_NEAR(lo.cpu.adamw_params_per_s[i].rate, base.cpu.adamw_params_per_s[i].rate * 0.5,
                1e-9 * base.cpu.adamw_params_per_s[i].rate);
    EXPECT_NEAR(hi.cpu.adamw_params_per_s[i].rate, base.cpu.adamw_params_per_s[i].rate * 2.0,
                1e-9 * base.cpu.adamw_params_per_s[i].rate);
  }
  // Not named in scale_with: unchanged.
  for (std::size_t i = 0; i < base.cpu.reduce_gbps.size(); ++i)
    EXPECT_DOUBLE_EQ(lo.cpu.reduce_gbps[i].rate, base.cpu.reduce_gbps[i].rate);
}

struct BadSpec {
  std::string name, from, to;
  std::vector<std::string> parts;  // the message must name these
};

void PrintTo(const BadSpec& b, std::ostream* os) { *os << b.name; }

class SweepSpecErrors : public ::testing::TestWithParam<BadSpec> {};

TEST_P(SweepSpecErrors, NameTheFileAndTheKey) {
  const BadSpec& b = GetParam();
  expect_error(edited(b.from, b.to), b.parts);
}

INSTANTIATE_TEST_SUITE_P(
    Spec, SweepSpecErrors,
    ::testing::Values(
        BadSpec{"unknown_top_level_key",
                "description:",
                "descriptoin:",
                {"bad.yaml", "descriptoin", "unknown key"}},
        BadSpec{"unknown_grid_key",
                "    seq_lens: [4096]",
                "    seq_lens: [4096]\n    seqlen: 5",
                {"bad.yaml", "grids[0].seqlen", "unknown key"}},
        BadSpec{
            "missing_grid_key", "    seq_lens: [4096]\n", "", {"bad.yaml", "grids[0].seq_lens", "missing"}},
        BadSpec{"unknown_expert_delivery",
                "    seq_lens: [4096]",
                "    seq_lens: [4096]\n    expert_delivery: some",
                {"bad.yaml", "grids[0].expert_delivery", "some"}},
        BadSpec{"router_skew_without_routed_delivery",
                "    seq_lens: [4096]",
                "    seq_lens: [4096]\n    router_skew: 1.0",
                {"bad.yaml", "grids[0].router_skew", "expert_delivery: routed"}},
        BadSpec{"unknown_optimizer_states",
                "    seq_lens: [4096]",
                "    seq_lens: [4096]\n    optimizer_states: int4",
                {"bad.yaml", "grids[0].optimizer_states", "int4"}},
        BadSpec{"lossy_states_beside_a_baseline",
                "    seq_lens: [4096]",
                "    seq_lens: [4096]\n    optimizer_states: bf16",
                {"bad.yaml", "grids[0].optimizer_states", "baselines"}},
        BadSpec{"clip_beside_a_baseline",
                "    seq_lens: [4096]",
                "    seq_lens: [4096]\n    clip: true",
                {"bad.yaml", "grids[0].clip", "baselines"}},
        BadSpec{"unknown_system",
                "systems: [slidedp, megatrain]",
                "systems: [slidedp, deepspeed]",
                {"bad.yaml", "grids[0].systems[1]", "deepspeed"}},
        BadSpec{"unknown_model",
                "models: [qwen3-14b, qwen2.5-7b]",
                "models: [qwen3-14b, qwen9-1t]",
                {"bad.yaml", "grids[0].models[1]", "qwen9-1t"}},
        BadSpec{"unknown_preset",
                "      - preset: h100-sxm-x4\n      - preset",
                "      - preset: h100-sxm-x5\n      - preset",
                {"bad.yaml", "grids[0].hardware[0].preset", "h100-sxm-x5"}},
        BadSpec{"override_key_not_in_preset",
                "{host_link: {h2d_gbps: 110.8,",
                "{host_link: {h2d_gbs: 110.8,",
                {"bad.yaml", "grids[0].hardware[1].overrides.host_link.h2d_gbs", "no such key"}},
        BadSpec{"override_section_not_in_preset",
                "overrides: {host_link:",
                "overrides: {hostlink:",
                {"bad.yaml", "overrides.hostlink", "no such key"}},
        BadSpec{"override_value_out_of_range",
                "{host_link: {h2d_gbps: 110.8,",
                "{host_link: {h2d_gbps: -1,",
                {"bad.yaml", "grids[0].hardware[1]", "h2d_gbps"}},
        BadSpec{"override_key_not_a_name",
                "overrides: {host_link:",
                "overrides: {[a, b]: 1, host_link:",
                {"bad.yaml", "grids[0].hardware[1].overrides", "plain name"}},
        BadSpec{"override_key_given_twice",
                "{host_link: {h2d_gbps: 110.8,",
                "{host_link: {h2d_gbps: 110.8, h2d_gbps: 110.8,",
                {"bad.yaml", "overrides.host_link.h2d_gbps", "given twice"}},
        BadSpec{"override_of_the_name",
                "overrides: {host_link:",
                "overrides: {name: x, host_link:",
                {"bad.yaml", "overrides.name", "cannot be overridden"}},
        BadSpec{"vary_key_not_in_preset",
                "key: host.mem_bw_gbps",
                "key: host.mem_bandwidth",
                {"bad.yaml", "grids[0].hardware[2].vary.key", "host.mem_bandwidth"}},
        BadSpec{"vary_unknown_subkey",
                "scale_with: [cpu.adamw_params_per_s]}",
                "scale: [cpu.adamw_params_per_s]}",
                {"bad.yaml", "vary.scale", "unknown key"}},
        BadSpec{"duplicate_labels",
                "label: gen6",
                "label: h100-sxm-x4",
                {"bad.yaml", "two machines", "h100-sxm-x4"}},
        BadSpec{"tokens_not_a_multiple",
                "tokens_per_step: [65536, 131072]",
                "tokens_per_step: [65536, 100000]",
                {"bad.yaml", "grids[0].tokens_per_step", "100000", "not a multiple"}},
        BadSpec{"more_ranks_than_gpus",
                "ranks: [1, 2, 8]",
                "ranks: [1, 2, 16]",
                {"bad.yaml", "grids[1].ranks", "16 ranks"}},
        BadSpec{"both_batch_keys",
                "sequences_per_rank: [4]",
                "sequences_per_rank: [4]\n    tokens_per_step: [65536]",
                {"bad.yaml", "grids[1]", "exactly one of"}},
        BadSpec{
            "no_batch_key", "    sequences_per_rank: [4]\n", "", {"bad.yaml", "grids[1]", "exactly one of"}},
        BadSpec{"zero_seq_len",
                "seq_lens: [2048]",
                "seq_lens: [0]",
                {"bad.yaml", "grids[1].seq_lens", "out of range"}},
        BadSpec{"fractional_tokens",
                "sequences_per_rank: [4]",
                "sequences_per_rank: [2.5]",
                {"bad.yaml", "sequences_per_rank", "not an integer"}},
        BadSpec{"duplicate_value",
                "seq_lens: [2048]",
                "seq_lens: [2048, 2048]",
                {"bad.yaml", "grids[1].seq_lens", "twice"}},
        BadSpec{"unknown_analysis",
                "analyses: [throughput, speedups]",
                "analyses: [throughput, speedup]",
                {"bad.yaml", "analyses[1]", "speedup"}},
        BadSpec{"unknown_claim_metric",
                "metric: speedup_geomean",
                "metric: speedup_mean",
                {"bad.yaml", "paper[0].metric", "speedup_mean"}},
        BadSpec{"claim_unknown_baseline",
                "baselines: [megatrain]",
                "baselines: [megatron]",
                {"bad.yaml", "paper[0].baselines[0]", "megatron"}},
        BadSpec{"name_with_slash", "name: t\n", "name: a/b\n", {"bad.yaml", "name", "slashes"}},
        BadSpec{"missing_grids", "grids:", "gridz:", {"bad.yaml", "grids", "missing"}},
        BadSpec{"duplicate_grid_names", "  - name: weak", "  - name: g", {"bad.yaml", "two grids", "'g'"}},
        BadSpec{
            "malformed_yaml", "systems: [slidedp]\n", "systems: [slidedp\n", {"bad.yaml", "malformed YAML"}}),
    [](const auto& tp) { return tp.param.name; });

TEST(SweepSpec, HardwareFilesResolveAgainstTheSpecFolder) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("slidedp_sweep_spec_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "box.yaml") << hardware_to_yaml(hardware_preset("a800-x4"));
    std::ofstream(dir / "s.yaml")
        << "name: s\ngrids:\n  - hardware: [{preset: box.yaml}]\n    models: [qwen2.5-7b]\n"
           "    seq_lens: [4096]\n    tokens_per_step: [16384]\n    systems: [slidedp]\n";
  }
  const SweepSpec s = load_sweep_spec((dir / "s.yaml").string());
  EXPECT_EQ(s.grids[0].hardware[0].hw.gpu.count, 4);
  EXPECT_EQ(s.grids[0].hardware[0].label, "box.yaml");
  fs::remove_all(dir);
}

// The committed specs parse and stay within a point budget that keeps each run to seconds or minutes
// (the planner takes up to about a second per point for 80-layer models).
TEST(SweepSpec, CommittedSpecsParseAndStaySmall) {
  namespace fs = std::filesystem;
  int specs = 0;
  for (const auto& e : fs::directory_iterator("sweeps/specs")) {
    if (e.path().extension() != ".yaml") continue;
    if (e.path().filename() == "validation.yaml") continue;  // the validation corpus: validation_test.cc
    ++specs;
    const SweepSpec s = load_sweep_spec(e.path().string());
    EXPECT_EQ(s.name + ".yaml", e.path().filename().string())
        << "a spec's name is its file name (and results folder)";
    const std::size_t n = expand_points(s).size();
    EXPECT_GT(n, 0u) << e.path();
    EXPECT_LE(n, 600u) << e.path() << ": keep sweeps small";
  }
  EXPECT_GE(specs, 4);
}

}  // namespace
}  // namespace slidedp
