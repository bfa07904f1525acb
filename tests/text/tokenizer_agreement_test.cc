// Our tokenizer against independent implementations on released tokenizer files: for Qwen3, Llama 3
// and Gemma 3, a generated corpus of more than 1 MB (reference_corpus.h) is encoded by ours, by Hugging
// Face `tokenizers` itself (its Node binding) and by @lenml/tokenizers (a JavaScript port), both from
// scripts/fetch_tokenizer_refs.sh: ids must be identical for every document. The characters on which
// the port's regexes differ from Hugging Face's are in separate edge documents, checked against
// Hugging Face only. Decoding: our text equals each reference's, and decode(encode(x)) == x wherever
// the tokenizer is lossless (Qwen normalizes to NFC, so there only for documents already in NFC).
// Exact equality: tokenization has no tolerance.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/shell_command.h"
#include "tests/text/reference_corpus.h"
#include "tests/text/text_test_util.h"
#include "text/normalizer.h"
#include "text/tokenizer.h"

namespace slidedp::text {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class Agreement : public ::testing::TestWithParam<std::string> {};

TEST_P(Agreement, IdsAndTextEqualTheReference) {
  const std::string family = GetParam();
  const fs::path modules = SLIDEDP_TOKREF_MODULES;
  const fs::path models = modules / ("@lenml/tokenizer-" + family) / "models";
  ASSERT_TRUE(fs::exists(models / "tokenizer.json"))
      << models << " is missing: the fixture TokenizerReferences.Fetch (scripts/fetch_tokenizer_refs.sh) fetches it";
  const Tokenizer tokenizer = Tokenizer::load(models);

  std::vector<std::string> added;
  std::ifstream json_file(models / "tokenizer.json");
  for (const auto& t : nlohmann::json::parse(json_file)["added_tokens"]) added.push_back(t["content"]);
  const std::vector<std::string> docs = slidedp::testing::reference_corpus(added, size_t{1} << 20, 2026);

  const std::vector<std::string> edges = slidedp::testing::edge_documents(300, 7);
  const fs::path dir = slidedp::testing::fresh_dir("agreement_" + family);
  WordCache cache;
  std::vector<std::vector<int32_t>> ours, ours_edges;
  size_t bytes = 0, tokens = 0;
  for (const std::string& d : docs) {
    ours.push_back(tokenizer.encode(d, false, &cache));
    bytes += d.size();
    tokens += ours.back().size();
  }
  for (const std::string& d : edges) ours_edges.push_back(tokenizer.encode(d, false, &cache));
  EXPECT_GE(bytes, size_t{1} << 20);

  const Normalizer nfc = Normalizer::from_json({{"type", "NFC"}}, "test");
  // Runs one reference over `texts`; our ids and decoded texts must equal its own.
  auto agree = [&](const std::string& impl, const std::vector<std::string>& texts,
                   const std::vector<std::vector<int32_t>>& ids) {
    {
      std::ofstream text_out(dir / "texts.jsonl"), ids_out(dir / "ids.jsonl");
      for (size_t i = 0; i < texts.size(); ++i) {
        text_out << nlohmann::json(texts[i]).dump() << "\n";
        ids_out << nlohmann::json(ids[i]).dump() << "\n";
      }
    }
    for (const char* mode : {"encode", "decode"}) {
      const auto r = slidedp::testing::run_shell(fmt::format(
          "node '{}' '{}' {} {} {} '{}' '{}'", SLIDEDP_REFERENCE_TOKENIZER_MJS, modules.string(), impl, family, mode,
          (dir / (mode == std::string("encode") ? "texts.jsonl" : "ids.jsonl")).string(),
          (dir / (std::string(mode) + "_reference.jsonl")).string()));
      ASSERT_EQ(r.code, 0) << r.out;
    }
    const std::vector<std::string> reference_ids = read_lines(dir / "encode_reference.jsonl");
    const std::vector<std::string> reference_text = read_lines(dir / "decode_reference.jsonl");
    ASSERT_EQ(reference_ids.size(), texts.size());
    ASSERT_EQ(reference_text.size(), texts.size());
    size_t id_mismatches = 0, text_mismatches = 0, round_trips = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      if (ids[i] != nlohmann::json::parse(reference_ids[i]).get<std::vector<int32_t>>() && id_mismatches++ < 3)
        ADD_FAILURE() << impl << " " << family << " document " << i << " differs: " << nlohmann::json(texts[i]).dump()
                      << "\n ours " << nlohmann::json(ids[i]).dump() << "\n reference " << reference_ids[i];
      const std::string text = tokenizer.decode(ids[i]);
      if (text != nlohmann::json::parse(reference_text[i]).get<std::string>() && text_mismatches++ < 3)
        ADD_FAILURE() << impl << " " << family << " document " << i << " decodes differently: ours "
                      << nlohmann::json(text).dump() << "\n reference " << reference_text[i];
      if (family != "qwen3" || nfc.apply(texts[i]) == texts[i]) {
        ++round_trips;
        EXPECT_EQ(text, texts[i]) << family << " document " << i << " does not round-trip";
      }
    }
    EXPECT_EQ(id_mismatches, 0u) << impl << ": of " << texts.size() << " documents";
    EXPECT_EQ(text_mismatches, 0u) << impl << ": of " << texts.size() << " documents";
    EXPECT_GT(round_trips, texts.size() / 4);  // the round trip ran on a real share of the documents
    std::printf("%s vs %s: %zu documents: ids identical in %zu, text in %zu, round trips %zu\n", family.c_str(),
                impl.c_str(), texts.size(), texts.size() - id_mismatches, texts.size() - text_mismatches, round_trips);
  };
  std::printf("%s: corpus of %zu documents, %zu bytes, %zu tokens; %zu edge documents\n", family.c_str(), docs.size(),
              bytes, tokens, edges.size());
  std::vector<std::string> all = docs;
  all.insert(all.end(), edges.begin(), edges.end());
  std::vector<std::vector<int32_t>> all_ids = ours;
  all_ids.insert(all_ids.end(), ours_edges.begin(), ours_edges.end());
  agree("hf", all, all_ids);
  agree("lenml", docs, ours);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Released, Agreement, ::testing::Values("qwen3", "llama3", "gemma3"));

}  // namespace
}  // namespace slidedp::text
