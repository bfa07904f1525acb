// A plan file (YAML), as slidedp-plan writes it and --plan reads it.
#include "fuzz/harness.h"
#include "model/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return slidedp::fuzz::check_input([&] { slidedp::plan_file_from_yaml(slidedp::fuzz::as_text(data, size), "plan.yaml"); });
}
