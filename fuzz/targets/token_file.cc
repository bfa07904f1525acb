// A SlideDP token file (docs/FORMATS.md: magic, version, flags, vocabulary, ids, optional loss mask).
#include "fuzz/harness.h"
#include "io/token_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string dir = slidedp::fuzz::write_input_file("tokens.tok", data, size);
  return slidedp::fuzz::check_input([&] { slidedp::TokenDataset::open(dir + "/tokens.tok"); });
}
