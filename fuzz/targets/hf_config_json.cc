// A Hugging Face config.json (every supported model_type, and the multimodal Gemma 4 / Qwen3.6 ones).
#include "card/model_card.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return slidedp::fuzz::check_input(
      [&] { slidedp::model_card_from_hf_config(slidedp::fuzz::as_text(data, size), "config.json"); });
}
