// A learning-rate schedule (YAML), as a checkpoint records it.
#include "executor/lr_schedule.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return slidedp::fuzz::check_input(
      [&] { slidedp::exec::lr_schedule_from_yaml(slidedp::fuzz::as_text(data, size), "schedule.yaml"); });
}
