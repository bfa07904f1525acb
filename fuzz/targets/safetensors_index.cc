// A sharded model's model.safetensors.index.json, beside two real shards (written once): the
// weight map against what the shards hold (SafetensorsSet::open_index).
#include <vector>

#include "fuzz/harness.h"
#include "io/safetensors.h"

namespace {

// Shard 1 holds a and b, shard 2 holds c (the seed index maps exactly these).
void write_shards(const std::string& folder) {
  const std::vector<float> values(6, 0.5f);
  slidedp::SafetensorsWriteOptions options;
  options.fsync = false;
  const slidedp::TensorToWrite one[] = {{"model.a.weight", {2, 3}, values}, {"model.b.weight", {6}, values}};
  const slidedp::TensorToWrite two[] = {{"model.c.weight", {3, 2}, values}};
  slidedp::write_safetensors(folder + "/model-00001-of-00002.safetensors", one, options);
  slidedp::write_safetensors(folder + "/model-00002-of-00002.safetensors", two, options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string dir = slidedp::fuzz::write_input_file("model.safetensors.index.json", data, size);
  static const bool shards_written = (write_shards(dir), true);
  (void)shards_written;
  return slidedp::fuzz::check_input(
      [&] { slidedp::SafetensorsSet::open_index(dir + "/model.safetensors.index.json"); });
}
