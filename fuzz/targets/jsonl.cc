// JSON lines of token ids (a list per line, or {"input_ids": [...], "loss_mask": [...]}).
#include "fuzz/harness.h"
#include "io/token_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return slidedp::fuzz::check_input([&] {
    slidedp::TokenStream out;
    slidedp::append_jsonl(out, slidedp::fuzz::as_text(data, size), "tokens.jsonl", 50000, 2);
  });
}
