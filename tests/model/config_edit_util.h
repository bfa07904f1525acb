// Edits a config.json text (one replacement) and checks that reading it is refused as bad input
// naming the file and what must be said: the shape of every "this config is refused" test here.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "card/model_card.h"
#include "common/error.h"

namespace slidedp::testing {

inline void expect_edited_config_refused(const std::string& base, const std::string& from, const std::string& to,
                                         const std::string& must_say) {
  SCOPED_TRACE(to);
  std::string text = base;
  ASSERT_NE(text.find(from), std::string::npos) << text;
  text.replace(text.find(from), from.size(), to);
  try {
    model_card_from_hf_config(text, "/m/config.json");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/m/config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(must_say), std::string::npos) << e.what();
  }
}

}  // namespace slidedp::testing
