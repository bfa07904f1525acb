// A smoke-scale CPU-backend profile of this machine through the library: every stage runs, the
// result is a valid Hardware profile with a source for each value, its YAML reads back to the same
// profile, and the model accepts it (its unit times are the ones the step model uses). The numbers
// themselves are not checked beyond being positive and finite: smoke sizes describe nothing.
#include "profiler/profile.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "model/hardware.h"
#include "model/simulator.h"
#include "model/step_model.h"
#include "model/step_work.h"
#include "profiler/gpu.h"
#include "profiler/report.h"

namespace slidedp::profiler {
namespace {

ProfileOptions smoke_options() {
  ProfileOptions o;
  o.scale = ProfileScale::kSmoke;
  o.models = {model_preset("slidedp-tiny")};
  o.seq_len = 16;
  o.micro_batches = {1, 2};
  o.ranks = 2;
  o.threads = {1, 2};
  o.reps = 2;
  o.cpu_backend = true;  // the CPU backend even in a CUDA build on a GPU machine
  o.command_line = "profile_test";
  return o;
}

// One profile per test binary: the smoke run takes about a second.
const ProfileResult& smoke() {
  static const ProfileResult r = run_profile(smoke_options());
  return r;
}

bool positive(double v) { return std::isfinite(v) && v > 0; }

TEST(Profile, SmokeRunProducesAValidCpuBackendProfile) {
  const ProfileResult& r = smoke();
  const Hardware& hw = r.hw;
  EXPECT_EQ(r.backend, "cpu");
  EXPECT_FALSE(r.gpu_note.empty());
  EXPECT_NO_THROW(hw.validate("test"));
  EXPECT_TRUE(hw.gpu.emulated_on_host);
  EXPECT_EQ(hw.gpu.count, 2);
  EXPECT_GE(hw.gpu.host_threads_per_device, 1);
  EXPECT_EQ(hw.fabric.kind, "pcie_p2p");
  for (double v : {hw.link.h2d_gbps, hw.link.d2h_gbps, hw.link.h2d_all_gbps, hw.link.d2h_all_gbps,
                   hw.link.h2d_bidir_gbps, hw.link.d2h_bidir_gbps, hw.fabric.allgather_busbw_gbps,
                   hw.fabric.reduce_scatter_busbw_gbps, hw.host.mem_bw_gbps, hw.gpu.bf16_peak_flops,
                   hw.gpu.hbm_gbps, hw.cpu.convert_gbps_per_thread})
    EXPECT_TRUE(positive(v)) << v;
  ASSERT_EQ(hw.cpu.adamw_params_per_s.size(), 2u);
  ASSERT_EQ(hw.cpu.reduce_gbps.size(), 2u);
  for (const RatePoint& p : hw.cpu.adamw_params_per_s) EXPECT_TRUE(positive(p.rate));
  for (const RatePoint& p : hw.cpu.reduce_gbps) EXPECT_TRUE(positive(p.rate));
  // Unit times for each kind, under the card's name.
  for (UnitKind k : {UnitKind::kEmbedding, UnitKind::kDecoder, UnitKind::kHead}) {
    const UnitTimeProfile* u = hw.find_unit_time("slidedp-tiny", k);
    ASSERT_NE(u, nullptr) << unit_kind_name(k);
    EXPECT_TRUE(positive(u->forward.eval(32, 16)));
    if (k != UnitKind::kHead) {
      EXPECT_TRUE(positive(u->backward.eval(32, 16)));
    }
  }
  // Every value the profile sets says where it came from.
  for (const char* key : {"host_link.h2d_gbps",
                          "host_link.d2h_gbps",
                          "host_link.h2d_all_gbps",
                          "host_link.d2h_all_gbps",
                          "host_link.h2d_bidir_gbps",
                          "host_link.d2h_bidir_gbps",
                          "host_link.latency_us",
                          "fabric.kind",
                          "fabric.allgather_busbw_gbps",
                          "fabric.reduce_scatter_busbw_gbps",
                          "fabric.latency_us",
                          "host.mem_bw_gbps",
                          "host.ram_bytes",
                          "host.pinned_limit_bytes",
                          "cpu.adamw_params_per_s",
                          "cpu.reduce_gbps",
                          "cpu.convert_gbps_per_thread",
                          "cpu.cores",
                          "gpu.count",
                          "gpu.mem_bytes",
                          "gpu.bf16_peak_flops",
                          "gpu.matmul_efficiency",
                          "gpu.hbm_gbps",
                          "gpu.kernel_overhead_s",
                          "gpu.emulated_on_host",
                          "gpu.host_threads_per_device",
                          "unit_times"})
    EXPECT_TRUE(hw.sources.count(key)) << key;
  EXPECT_NE(hw.sources.at("host_link.h2d_gbps").find("measured by slidedp-profile"), std::string::npos);
}

TEST(Profile, EveryCaseKeepsEveryRepetitionForTheRunLog) {
  const ProfileResult& r = smoke();
  std::size_t values = 0;
  for (const Measurement& m : r.measurements.all()) {
    EXPECT_EQ(m.values.size(), 2u) << m.key();
    // A copy thread can be starved for a whole short window while the triad runs on every core, so
    // its rate may be 0; everything else is a positive rate or time.
    for (double v : m.values) {
      if (m.name == "dma_under_triad_gbps")
        EXPECT_TRUE(std::isfinite(v) && v >= 0) << m.key();
      else
        EXPECT_TRUE(positive(v)) << m.key();
    }
    values += m.values.size();
  }
  const auto samples = r.measurements.samples();
  EXPECT_EQ(samples.size(), values);
  for (const auto& s : samples) {
    EXPECT_FALSE(s.unit.empty());
    EXPECT_NE(s.params_json.find("\"rep\""), std::string::npos);
  }
  for (const char* stage : {"host_memory", "cpu_update", "links", "fabric", "units"}) {
    bool found = false;
    for (const Measurement& m : r.measurements.all()) found |= m.stage == stage;
    EXPECT_TRUE(found) << stage;
  }
}

TEST(Profile, YamlRoundTripGivesTheSameProfile) {
  const ProfileResult& r = smoke();
  const std::string text = profile_yaml(r);
  EXPECT_NE(text.find("\nmeasured:"), std::string::npos);
  Hardware back = hardware_from_yaml(text, "round trip");
  // The writer keeps 15 significant digits, so writing what was read gives the same text.
  EXPECT_EQ(hardware_to_yaml(back), hardware_to_yaml(r.hw));
  EXPECT_EQ(back.name, r.hw.name);
  EXPECT_EQ(back.gpu.emulated_on_host, true);
  EXPECT_EQ(back.unit_times.size(), 3u);
  EXPECT_NEAR(back.link.h2d_gbps, r.hw.link.h2d_gbps, r.hw.link.h2d_gbps * 1e-13);
  EXPECT_NEAR(back.link.latency_s, r.hw.link.latency_s, r.hw.link.latency_s * 1e-13);
  EXPECT_EQ(back.sources, r.hw.sources);
}

TEST(Profile, TheModelAcceptsTheProfileAndUsesItsUnitTimes) {
  const ProfileResult& r = smoke();
  const Workload w = make_workload(model_preset("slidedp-tiny"), 16);
  const UnitTimeProfile* dec = r.hw.find_unit_time("slidedp-tiny", UnitKind::kDecoder);
  ASSERT_NE(dec, nullptr);
  const UnitComputeTimes t = unit_compute_times(w, r.hw, UnitKind::kDecoder, 0, 2);
  EXPECT_DOUBLE_EQ(t.fwd_s, dec->forward.eval(32, 16));
  EXPECT_DOUBLE_EQ(t.bwd_s, dec->backward.eval(32, 16));
  EXPECT_DOUBLE_EQ(t.recompute_s, dec->recompute.eval(32, 16));
  for (int ranks : {1, 2, 4}) {
    for (ParamRoute route : {ParamRoute::kReplicated, ParamRoute::kSharded}) {
      Plan p;
      p.ranks = ranks;
      p.micro_batch = 2;
      p.param_route = route;
      p.grad_route = ranks > 1 ? GradRoute::kGpu : GradRoute::kCpu;
      p.chunk_numel = 1 << 14;
      Prediction a = predict_analytical(w, r.hw, p);
      EXPECT_TRUE(a.feasible);
      EXPECT_TRUE(positive(a.step_time_s)) << p.summary(4);
      EXPECT_NEAR(a.breakdown.total(), a.step_time_s, a.step_time_s * 1e-9);
      Simulation s = simulate(w, r.hw, p, System::kSlideDP, {});
      EXPECT_TRUE(positive(s.prediction.step_time_s)) << p.summary(4);
    }
  }
}

// Models whose decoder layers differ: each layer type is measured on its first layer and gets its
// own decoder unit times (layer_type in the YAML), and the step model charges each layer its type's.
TEST(Profile, ModelsWhoseLayersDifferGetUnitTimesPerLayerType) {
  ProfileOptions o = smoke_options();
  o.models = {model_card_from_yaml(
                  "name: tiny-gemma4\nmodel_type: gemma4\nhidden_size: 32\nnum_hidden_layers: 3\nnum_attention_heads: 4\n"
                  "num_key_value_heads: 2\nhead_dim: 8\nintermediate_size: 48\nvocab_size: 256\n"
                  "layer_types: [sliding_attention, sliding_attention, full_attention]\nsliding_window: 5\n"
                  "global_head_dim: 16\nnum_global_key_value_heads: 1\nattention_k_eq_v: true\nrope_theta: 10000\n"
                  "global_rope_theta: 1000000\nglobal_partial_rotary_factor: 0.25\nfinal_logit_softcapping: 30.0\n",
                  "tiny-gemma4"),
              model_card_from_yaml(
                  "name: tiny-qwen3-5\nmodel_type: qwen3_5\nhidden_size: 32\nnum_hidden_layers: 4\nnum_attention_heads: 4\n"
                  "num_key_value_heads: 2\nhead_dim: 8\nintermediate_size: 48\nvocab_size: 256\nrope_theta: 10000000\n"
                  "partial_rotary_factor: 0.25\nlinear_num_key_heads: 2\nlinear_num_value_heads: 4\nlinear_key_head_dim: 8\n"
                  "linear_value_head_dim: 8\nlinear_conv_kernel_dim: 4\n",
                  "tiny-qwen3-5")};
  const ProfileResult r = run_profile(o);
  const struct {
    const ModelCard& card;
    AttentionKind types[2];
  } models[] = {{o.models[0], {AttentionKind::kSliding, AttentionKind::kFull}},
                {o.models[1], {AttentionKind::kLinear, AttentionKind::kFull}}};
  const Hardware back = hardware_from_yaml(profile_yaml(r), "round trip");
  EXPECT_EQ(hardware_to_yaml(back), hardware_to_yaml(r.hw));
  for (const auto& m : models) {
    SCOPED_TRACE(m.card.name);
    EXPECT_EQ(r.hw.find_unit_time(m.card.name, UnitKind::kDecoder), nullptr) << "no untyped decoder times";
    const Workload w = make_workload(m.card, 16);
    for (AttentionKind type : m.types) {
      const UnitTimeProfile* dec = back.find_unit_time(m.card.name, UnitKind::kDecoder, type);
      ASSERT_NE(dec, nullptr) << attention_kind_name(type);
      EXPECT_TRUE(positive(dec->forward.eval(32, 16)));
      // every layer of this type is charged this type's times
      for (int l = 0; l < static_cast<int>(m.card.num_layers); ++l) {
        if (m.card.layer(l).attention != type) continue;
        const UnitComputeTimes t = unit_compute_times(w, back, UnitKind::kDecoder, l, 2);
        EXPECT_DOUBLE_EQ(t.fwd_s, dec->forward.eval(32, 16)) << "layer " << l;
        EXPECT_DOUBLE_EQ(t.bwd_s, dec->backward.eval(32, 16)) << "layer " << l;
        EXPECT_DOUBLE_EQ(t.recompute_s, dec->recompute.eval(32, 16)) << "layer " << l;
      }
    }
    Plan p;
    p.ranks = 2;
    p.micro_batch = 2;
    p.chunk_numel = 1 << 14;
    p.gpu_buffer_depth = 2;
    EXPECT_TRUE(positive(predict_analytical(w, back, p).step_time_s));
  }
  // the tables name the layer type of every decoder row
  EXPECT_NE(profile_tables(r, true).find("decoder:sliding_attention"), std::string::npos);
  EXPECT_NE(profile_tables(r, true).find("decoder:linear_attention"), std::string::npos);
}

TEST(Profile, ReportsRenderFromTheSameResult) {
  const ProfileResult& r = smoke();
  const std::string console = profile_tables(r, false), md = profile_tables(r, true);
  for (const char* s : {"Host memory", "CPU update", "Links and fabric", "Unit compute", "Unit time fits"}) {
    EXPECT_NE(console.find(s), std::string::npos) << s;
    EXPECT_NE(md.find(s), std::string::npos) << s;
  }
  nlohmann::json j = profile_json(r);
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["hardware"]["gpu"]["emulated_on_host"], true);
  EXPECT_EQ(j["measurements"].size(), r.measurements.all().size());
  EXPECT_FALSE(j["fits"].empty());
}

TEST(Profile, BadOptionsAreNamedInputErrors) {
  ProfileOptions o = smoke_options();
  o.micro_batches = {};
  EXPECT_THROW(run_profile(o), InputError);
  o = smoke_options();
  o.ranks = 0;
  EXPECT_THROW(run_profile(o), InputError);
  o = smoke_options();
  o.seq_len = 1 << 30;
  EXPECT_THROW(run_profile(o), InputError);
  o = smoke_options();  // --kernels needs the GPU's kernels
  o.kernels = true;
  try {
    run_profile(o);
    ADD_FAILURE() << "--kernels with --cpu-backend was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--kernels"), std::string::npos) << e.what();
  }
}

// --kernels on a GPU (skipped without one): every unit operation lists the kernels it ran, their
// device time is positive and no more than the operation's measured time (the kernels of one run
// on device 0 alone, against the median of the timed runs; a 1.5x margin for the timing spread), and
// the decoder's forward includes the attention kernel.
TEST(Profile, KernelsOnAGpuBreakDownEveryUnitOperation) {
  const GpuInventory inv = probe_gpus();
  if (inv.count == 0) GTEST_SKIP() << "no GPU (" << inv.why_none << "): this GPU test runs only where a GPU is";
  ProfileOptions o = smoke_options();
  o.cpu_backend = false;
  o.kernels = true;
  ProfileResult r;
  try {
    r = run_profile(o);
  } catch (const InputError& e) {
    if (std::string(e.what()).find("libcupti") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  ASSERT_EQ(r.backend, "cuda");
  ASSERT_FALSE(r.units.empty());
  bool attention = false;
  for (const UnitCase& c : r.units.front().cases) {
    SCOPED_TRACE(unit_label(c.kind, c.layer_type) + " " + c.op);
    ASSERT_FALSE(c.kernels.empty());
    double sum = 0;
    for (const exec::KernelTotal& k : c.kernels) {
      EXPECT_GT(k.calls, 0);
      EXPECT_GT(k.seconds, 0.0);
      sum += k.seconds;
      if (c.kind == UnitKind::kDecoder && c.op == "fwd" && k.kernel.find("attention") != std::string::npos)
        attention = true;
    }
    EXPECT_LE(sum, 1.5 * (c.has_alone ? c.alone_seconds.median : c.seconds.median));
  }
  EXPECT_TRUE(attention) << "the decoder's forward runs an attention kernel";
}

}  // namespace
}  // namespace slidedp::profiler
