// Hardware profiles: every preset loads and validates, YAML round trips, strict errors, interpolation.
#include <gtest/gtest.h>

#include "common/error.h"
#include "model/hardware.h"

namespace slidedp {
namespace {

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
  try {
    hardware_from_yaml(y, "hw.yaml");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("hw.yaml: gpu.hbm_gbs"), std::string::npos) << e.what();
  }
}

TEST(Hardware, OutOfRangeValueNamesTheUnit) {
  std::string y = hardware_to_yaml(hardware_preset("rtx4090-x4"));
  y.replace(y.find("h2d_gbps: 23.7"), 14, "h2d_gbps: -3");
  try {
    hardware_from_yaml(y, "hw.yaml");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("host_link.h2d_gbps"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("GB/s"), std::string::npos) << e.what();
  }
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
