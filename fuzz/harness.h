// What every fuzz target asserts about its parser: any input either parses or is refused with one of
// SlideDP's errors (common/error.h: bad input, I/O, numeric, infeasible, runtime), which the tools turn
// into exit codes 2-6 naming the file and field. Anything else (another exception, which the tools
// report as exit 1 "internal error"; a crash; a sanitizer report) is a finding: abort, so libFuzzer
// and the replay runner (replay_main.cc) both stop there with the input.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>

#include "common/error.h"

namespace slidedp::fuzz {

template <class Parse>
int check_input(Parse&& parse) {
  try {
    parse();
  } catch (const Error&) {
    // Refused with a SlideDP error: what a user gets as a clear message and a documented exit code.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: not a SlideDP error (the tools would exit 1): %s\n", e.what());
    std::abort();
  }
  return 0;
}

inline std::string as_text(const uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}
inline std::span<const uint8_t> as_bytes(const uint8_t* data, std::size_t size) { return {data, size}; }

// For parsers that read a file: `data` written to `name` in a folder of this process's own (made once,
// the file overwritten by every input); returns the folder.
std::string write_input_file(const std::string& name, const uint8_t* data, std::size_t size);

}  // namespace slidedp::fuzz

// Each target defines this (libFuzzer's entry point).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);
