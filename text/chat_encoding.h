// A conversation as training tokens: rendered with the model's own chat template as transformers'
// apply_chat_template renders it (tokenize=False, no generation prompt), tokenized without the
// post-processor's tokens (the template writes them), and a loss mask that covers the assistant's turns
// only, as TRL's assistant-only loss and torchtune's train_on_input=False do:
//  * where the template marks the assistant's output with {% generation %}, exactly those characters;
//  * otherwise each assistant message's answer is found in the rendered text, in order after the
//    previous turn, with its thinking block when the template renders one for that turn, and the
//    special token that closes the turn right after it (<|im_end|>, <|eot_id|>, <end_of_turn>), so the
//    model learns to stop.
// A token counts when any of its characters lies in an assistant range (transformers' rule for
// return_assistant_tokens_mask). Input lines are {"messages": [...]} (optionally "tools") or
// {"prompt": ..., "completion": ...} (strings: one user and one assistant message; lists: messages).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/jinja_template.h"
#include "text/tokenizer.h"

namespace slidedp::text {

struct ChatExample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;  // 1: an assistant token (a training target)
  std::string rendered;       // the template's output
  int64_t assistant_turns = 0;
};

class ChatEncoder {
 public:
  // Throws InputError naming the tokenizer's files when it has no chat template, or the template
  // line of an unsupported construct.
  explicit ChatEncoder(const Tokenizer& tokenizer);
  // Another template than the tokenizer's (`origin` names it in errors).
  ChatEncoder(const Tokenizer& tokenizer, const std::string& template_source, const std::string& origin);

  // `line`: one conversation (see above); `where` names it in errors ("file: line N"). `train_on_all`:
  // every token counts.
  ChatExample encode(const nlohmann::ordered_json& line, bool train_on_all, const std::string& where,
                     WordCache* cache = nullptr) const;

  // Whether a JSON line is a conversation this encoder reads.
  static bool is_conversation(const nlohmann::ordered_json& line);

 private:
  std::vector<std::pair<std::size_t, std::size_t>> find_assistant_spans(const nlohmann::ordered_json& messages,
                                                                        const nlohmann::ordered_json& variables,
                                                                        const std::string& text,
                                                                        const std::string& where) const;
  const Tokenizer& tokenizer_;
  std::string origin_;  // where the template came from
  jinja::Template template_;
  std::vector<std::string> turn_ends_;  // the special tokens' texts, longest first
};

}  // namespace slidedp::text
