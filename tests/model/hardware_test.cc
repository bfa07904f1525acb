// Hardware profiles: every preset loads and validates, YAML round trips, strict errors, interpolation.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "common/error.h"
#include "model/hardware.h"

namespace slidedp {
namespace {

// Parsing `yaml` (as file `file`) must throw an InputError whose message holds every one of `parts`.
void expect_yaml_error(const std::string& yaml, const std::string& file, std::initializer_list<const char*> parts) {
  try {
    hardware_from_yaml(yaml, file);
    ADD_FAILURE() << "no error for " << file;
  } catch (const InputError& e) {
    for (const char* part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Hardware, AllRequiredPresetsExistAndValidate) {
  for (const char* name : {"h100-sxm-x4", "h100-sxm-x8", "rtx4090-x4", "a800-x4", "h200-x8", "gh200-x4",
                           "h100-gen6-x4"}) {
    ASSERT_TRUE(is_hardware_preset(name)) << name;
    Hardware hw = hardware_preset(name);
    EXPECT_EQ(hw.name, name);
    EXPECT_FALSE(hw.sources.empty()) << name << " must say where its numbers come from";
  }
}

TEST(Hardware, YamlRoundTripIsLossless) {
  for (const std::string& name : hardware_preset_names()) {
    Hardware a = hardware_preset(name);
    std::string y = hardware_to_yaml(a);
    Hardware b = hardware_from_yaml(y, "roundtrip");
    EXPECT_EQ(hardware_to_yaml(b), y) << name;
  }
}

TEST(Hardware, UnknownKeyIsAnErrorWithThePath) {
  std::string y = hardware_to_yaml(hardware_preset("h100-sxm-x4"));
  y.replace(y.find("hbm_gbps"), 8, "hbm_gbs");
  expect_yaml_error(y, "hw.yaml", {"hw.yaml: gpu.hbm_gbs"});
}

TEST(Hardware, OutOfRangeValueNamesTheUnit) {
  std::string y = hardware_to_yaml(hardware_preset("rtx4090-x4"));
  y.replace(y.find("h2d_gbps: 23.7"), 14, "h2d_gbps: -3");
  expect_yaml_error(y, "hw.yaml", {"host_link.h2d_gbps", "GB/s"});
}

// Decoder unit times per layer type (models whose layers differ): the type round-trips, a type on
// another unit kind or an unknown type is refused naming the key.
TEST(Hardware, UnitTimesCarryTheirLayerType) {
  Hardware hw = hardware_preset("cpu-dev");
  UnitTimeProfile u;
  u.model = "m";
  u.unit = UnitKind::kDecoder;
  u.forward = u.backward = u.recompute = TimeFit{1e-3, 1e-6, 0};
  u.layer_type = AttentionKind::kSliding;
  hw.unit_times.push_back(u);
  const std::string y = hardware_to_yaml(hw);
  const Hardware back = hardware_from_yaml(y, "hw.yaml");
  ASSERT_NE(back.find_unit_time("m", UnitKind::kDecoder, AttentionKind::kSliding), nullptr);
  EXPECT_EQ(back.find_unit_time("m", UnitKind::kDecoder), nullptr);
  EXPECT_EQ(back.find_unit_time("m", UnitKind::kDecoder, AttentionKind::kFull), nullptr);
  std::string bad = y;
  bad.replace(bad.find("sliding_attention"), 17, "local_attention");
  expect_yaml_error(bad, "hw.yaml", {"layer_type", "local_attention"});
  std::string head = y;
  head.replace(head.find("unit: decoder"), 13, "unit: head");
  expect_yaml_error(head, "hw.yaml", {"layer_type", "only decoder"});
}

// A zero in a CPU rate table would make the update take forever (the planner and the simulator
// then met NaN and aborted), and a rate of 1e-300 gave an infinite duration (an emulated run that
// never ended): refused naming the table, the thread count and the range.
TEST(Hardware, ZeroOrVanishingRateInACpuTableIsRefusedNamingIt) {
  for (const double bad : {0.0, 1e-300}) {
    for (const std::string table : {"adamw_params_per_s", "reduce_gbps"}) {
      Hardware hw = hardware_preset("h100-sxm-x4");
      auto& points = table == "adamw_params_per_s" ? hw.cpu.adamw_params_per_s : hw.cpu.reduce_gbps;
      points.front().rate = bad;
      if (bad == 0) {
        EXPECT_THROW(hw.validate("hw"), InputError) << table;
      }
      const std::string key = "cpu." + table + "." + std::to_string(points.front().threads);
      expect_yaml_error(hardware_to_yaml(hw), "hw.yaml", {key.c_str(), "out of range"});
    }
  }
}

TEST(Hardware, SyncTermRoundTripsAndGrowsAsSqrtTwoLogRanks) {
  Hardware a = hardware_preset("h100-sxm-x4");
  EXPECT_EQ(a.sync.factor(8), 1.0);  // presets do not claim a measured term
  EXPECT_EQ(hardware_to_yaml(a).find("sync:"), std::string::npos);
  a.sync = {0.06, 0.075};
  const std::string y = hardware_to_yaml(a);
  const Hardware b = hardware_from_yaml(y, "calibrated.yaml");
  EXPECT_EQ(b.sync.base, 0.06);
  EXPECT_EQ(b.sync.straggler, 0.075);
  EXPECT_EQ(hardware_to_yaml(b), y);
  // 1 + base + straggler sqrt(2 ln N), by hand: sqrt(2 ln 4) = 1.66511.
  EXPECT_DOUBLE_EQ(b.sync.factor(1), 1.06);
  EXPECT_NEAR(b.sync.factor(4), 1.06 + 0.075 * 1.6651092223153954, 1e-15);
  // A term above 1 (a step more than twice its pipeline, as on an oversubscribed host) reads back.
  a.sync = {1.79, 0.2};
  EXPECT_EQ(hardware_from_yaml(hardware_to_yaml(a), "busy.yaml").sync.base, 1.79);
  // A negative term is not synchronisation: the schema refuses it, naming the key and the unit.
  std::string bad = y;
  bad.replace(bad.find("base: 0.06"), 10, "base: -0.1");
  expect_yaml_error(bad, "calibrated.yaml", {"calibrated.yaml: sync.base", "fraction of the step"});
}

TEST(Hardware, RateTableInterpolatesLinearlyAndIsFlatBeyondTheEnd) {
  std::vector<RatePoint> t = {{1, 1.0}, {4, 4.0}, {8, 6.0}};
  EXPECT_DOUBLE_EQ(CpuSpec::interpolate(t, 1), 1.0);
  EXPECT_DOUBLE_EQ(CpuSpec::interpolate(t, 2), 2.0);
  EXPECT_DOUBLE_EQ(CpuSpec::interpolate(t, 6), 5.0);
  EXPECT_DOUBLE_EQ(CpuSpec::interpolate(t, 64), 6.0);
  EXPECT_DOUBLE_EQ(CpuSpec::interpolate(t, 0.5), 0.5);
}

TEST(Hardware, UnknownNameListsPresets) {
  try {
    load_hardware("tpu-v9");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("h100-sxm-x4"), std::string::npos);
  }
}

}  // namespace
}  // namespace slidedp
