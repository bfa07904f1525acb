// A hardware profile (YAML): presets, slidedp-profile output, calibrated profiles.
#include "fuzz/harness.h"
#include "model/hardware.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return slidedp::fuzz::check_input([&] { slidedp::hardware_from_yaml(slidedp::fuzz::as_text(data, size), "fuzz.yaml"); });
}
