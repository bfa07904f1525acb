// A 1-D NumPy .npy array of token ids, as slidedp-data build imports it.
#include "fuzz/harness.h"
#include "io/token_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return slidedp::fuzz::check_input([&] {
    slidedp::TokenStream out;
    slidedp::append_npy(out, slidedp::fuzz::as_bytes(data, size), "tokens.npy", 50000, 2);
  });
}
