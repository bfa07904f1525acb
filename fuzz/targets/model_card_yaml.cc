// A model card (YAML), as the presets and --model FILE.yaml give it.
#include "card/model_card.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return slidedp::fuzz::check_input([&] { slidedp::model_card_from_yaml(slidedp::fuzz::as_text(data, size), "fuzz.yaml"); });
}
