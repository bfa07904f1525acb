// Minimal safetensors reader for the golden files (8-byte little-endian header length, JSON header
// with __metadata__ and {dtype, shape, data_offsets} per tensor, raw little-endian data). Test-only:
// the executor's checkpoint code owns the production reader/writer.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"

namespace slidedp::kernels::test {

struct StTensor {
  std::string dtype;  // "BF16", "F64", "I32", ...
  std::vector<int64_t> shape;
  std::string bytes;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  template <typename U>
  std::vector<U> as() const {
    std::vector<U> v(bytes.size() / sizeof(U));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(U));
    return v;
  }
};

struct StFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, StTensor> tensors;
  const StTensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw InputError(name, "tensor missing from the golden file");
    return it->second;
  }
};

inline StFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path, "cannot open");
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() < 8) throw IoError(path, "truncated");
  uint64_t header_len = 0;
  std::memcpy(&header_len, data.data(), 8);  // little-endian host (x86-64)
  if (8 + header_len > data.size()) throw IoError(path, "header runs past the end");
  const auto header = nlohmann::json::parse(data.substr(8, header_len));
  const size_t base = 8 + header_len;
  StFile f;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      for (const auto& [mk, mv] : value.items()) f.metadata[mk] = mv.get<std::string>();
      continue;
    }
    StTensor t;
    t.dtype = value.at("dtype").get<std::string>();
    t.shape = value.at("shape").get<std::vector<int64_t>>();
    const auto off = value.at("data_offsets").get<std::vector<uint64_t>>();
    if (off.size() != 2 || off[0] > off[1] || base + off[1] > data.size())
      throw IoError(path, key + ": bad offsets");
    t.bytes = data.substr(base + off[0], off[1] - off[0]);
    f.tensors.emplace(key, std::move(t));
  }
  return f;
}

}  // namespace slidedp::kernels::test
