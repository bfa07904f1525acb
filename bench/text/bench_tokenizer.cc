// Encoding speed of the model's tokenizer on one core, on the agreement test's generated corpus
// (tests/text/reference_corpus.h), beside the floor of its own first pass: the pre-tokenizer's regex
// over the same text (no encoder can split faster than it scans). Writes the corpus as JSON lines so
// that scripts/bench_tokenizer.sh can time Hugging Face tokenizers on the same bytes.
//   bench_tokenizer MODEL_DIR CORPUS_OUT.jsonl [MIN_MB]
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/text/reference_corpus.h"
#include "text/pre_tokenizer.h"
#include "text/tokenizer.h"

int main(int argc, char** argv) {
  using slidedp::text::Tokenizer;
  if (argc < 3) {
    fmt::print(stderr, "usage: bench_tokenizer MODEL_DIR CORPUS_OUT.jsonl [MIN_MB]\n");
    return 2;
  }
  const Tokenizer tokenizer = Tokenizer::load(argv[1]);
  const size_t min_bytes = static_cast<size_t>((argc > 3 ? std::stod(argv[3]) : 4.0) * (1 << 20));
  std::ifstream json_file(std::filesystem::path(argv[1]) / "tokenizer.json");
  const nlohmann::json j = nlohmann::json::parse(json_file);
  std::vector<std::string> added;
  for (const auto& t : j["added_tokens"]) added.push_back(t["content"]);
  const std::vector<std::string> docs = slidedp::testing::reference_corpus(added, min_bytes, 2026);
  size_t bytes = 0;
  {
    std::ofstream out(argv[2]);
    for (const std::string& d : docs) out << nlohmann::json(d).dump() << "\n", bytes += d.size();
  }
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };

  // Encode, as slidedp-data does: one word cache for the whole corpus (the first pass fills it).
  slidedp::text::WordCache cache;
  size_t tokens = 0;
  auto t0 = clock::now();
  for (const std::string& d : docs) tokens += tokenizer.encode(d, false, &cache).size();
  const double first_s = seconds(t0);
  t0 = clock::now();
  for (const std::string& d : docs) tokenizer.encode(d, false, &cache);
  const double warm_s = seconds(t0);
  t0 = clock::now();
  for (const std::string& d : docs) tokenizer.encode(d, false, nullptr);
  const double uncached_s = seconds(t0);

  // The floor: the pre-tokenizer alone (normalizer not included) over the same text.
  const auto pre = slidedp::text::PreTokenizer::from_json(j["pre_tokenizer"], "pre_tokenizer");
  std::vector<std::string> words;
  t0 = clock::now();
  for (const std::string& d : docs) words.clear(), pre.split(d, words);
  const double split_s = seconds(t0);

  const double mb = static_cast<double>(bytes) / 1e6;
  fmt::print("{{\"model\": \"{}\", \"documents\": {}, \"bytes\": {}, \"tokens\": {}, \"encode_first_pass_mb_per_s\": {:.2f}, "
             "\"encode_warm_cache_mb_per_s\": {:.2f}, \"encode_no_cache_mb_per_s\": {:.2f}, "
             "\"pre_tokenizer_only_mb_per_s\": {:.2f}}}\n",
             argv[1], docs.size(), bytes, tokens, mb / first_s, mb / warm_s, mb / uncached_s, mb / split_s);
  return 0;
}
