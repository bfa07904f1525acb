// Helpers for the io tests: a self-deleting temp folder, tiny model cards in the real config.json
// form, random unit buffers (padding zero, values exactly representable in bf16 when asked), and a
// helper that runs a command and captures its output and exit code.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "card/model_card.h"
#include "card/unit_layout.h"
#include "common/bf16.h"
#include "common/error.h"
#include "io/unit_tensors.h"

namespace slidedp::testing {

// The message of the SlideDP error f() throws, or "(no error)".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "slidedp-io-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const {
    return (std::filesystem::path(path_) / name).string();
  }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A tiny config.json of the given type (head_dim 8, so q/k norms and biases are small but real).
inline std::string tiny_config_json(const std::string& model_type, bool tied, int layers = 2,
                                    int vocab = 64) {
  return "{\"model_type\": \"" + model_type +
         "\", \"hidden_size\": 32, \"num_hidden_layers\": " + std::to_string(layers) +
         ", \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, "
         "\"intermediate_size\": 48, \"vocab_size\": " +
         std::to_string(vocab) +
         ", \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": " +
         (tied ? "true" : "false") + "}";
}

inline ModelCard tiny_card(const std::string& model_type = "llama", bool tied = false, int layers = 2,
                           int vocab = 64) {
  return model_card_from_hf_config(tiny_config_json(model_type, tied, layers, vocab), "tiny config.json");
}

// Random buffers for every unit: tensor elements from N(0, 1) (rounded to bf16 when `bf16_exact`, so a
// bf16 save is lossless), padding exactly +0.
inline UnitBuffers random_units(const ModelLayout& layout, uint64_t seed, bool bf16_exact) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  UnitBuffers units = zero_unit_buffers(layout);
  for (std::size_t u = 0; u < layout.units.size(); ++u)
    for (const auto& t : layout.units[u].tensors)
      for (int64_t i = 0; i < t.numel; ++i) {
        float v = normal(rng);
        units[u][static_cast<std::size_t>(t.offset + i)] = bf16_exact ? round_to_bf16(v) : v;
      }
  return units;
}

inline bool bitwise_equal(const UnitBuffers& a, const UnitBuffers& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t u = 0; u < a.size(); ++u) {
    if (a[u].size() != b[u].size()) return false;
    if (!a[u].empty() && std::memcmp(a[u].data(), b[u].data(), a[u].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace slidedp::testing
