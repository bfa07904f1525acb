// A sweep spec (YAML), as slidedp-sweep run / measured read it.
#include "fuzz/harness.h"
#include "sweeps/sweep_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return slidedp::fuzz::check_input([&] { slidedp::sweep_spec_from_yaml(slidedp::fuzz::as_text(data, size), "spec.yaml"); });
}
