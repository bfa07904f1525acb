// Small tokenizer.json files written by the tests, so that unit tests need no released tokenizer.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

namespace slidedp::testing {

// A fresh folder under the test temp dir, named after the test.
inline std::filesystem::path fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("slidedp_text_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump();
}

// A byte-level BPE tokenizer.json (Qwen's layout): 256 byte tokens, then one token per merge.
inline nlohmann::json byte_level_tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                                                 const std::string& split_regex) {
  nlohmann::json vocab = nlohmann::json::object();
  // the GPT-2 byte-level alphabet, written out independently of text/byte_level.cc
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) bs.push_back(b), cs.push_back(256 + n++);
  std::map<int, std::string> char_of;
  for (size_t i = 0; i < bs.size(); ++i) {
    std::string u;
    const int c = cs[i];
    if (c < 0x80) u.push_back(static_cast<char>(c));
    else u.push_back(static_cast<char>(0xC0 | (c >> 6))), u.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    char_of[bs[i]] = u;
  }
  auto encode = [&](const std::string& raw) {
    std::string out;
    for (unsigned char b : raw) out += char_of[b];
    return out;
  };
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[char_of[b]] = id++;
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(encode(a + b))) vocab[encode(a + b)] = id++;
    merge_list.push_back(encode(a) + " " + encode(b));
  }
  return {{"version", "1.0"},
          {"added_tokens", nlohmann::json::array({{{"id", id}, {"content", "<|end|>"}, {"special", true},
                                                    {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                                    {"single_word", false}}})},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             nlohmann::json::array({{{"type", "Split"}, {"pattern", {{"Regex", split_regex}}}, {"behavior", "Isolated"},
                                     {"invert", false}},
                                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                                     {"use_regex", false}}})}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
            {"ignore_merges", false}, {"vocab", vocab}, {"merges", merge_list}}}};
}

}  // namespace slidedp::testing
