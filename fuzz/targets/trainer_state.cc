// A checkpoint's trainer_state.json (steps, the schedule, the data cursor, RNG words as "0x..." strings).
#include "fuzz/harness.h"
#include "io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string dir = slidedp::fuzz::write_input_file("trainer_state.json", data, size);
  return slidedp::fuzz::check_input([&] { slidedp::load_trainer_state(dir); });
}
