// A safetensors file image: the 8-byte header length, the JSON header, the data ranges.
#include "fuzz/harness.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return slidedp::fuzz::check_input(
      [&] { slidedp::parse_safetensors(slidedp::fuzz::as_bytes(data, size), "model.safetensors"); });
}
