// The fuzz targets without libFuzzer (any compiler): replays every seed and file given, then runs
// --mutations structure-aware variants of each (mutate.h), deterministic in --seed. CI runs each target
// this way; scripts/fuzz.sh builds the same targets with clang's libFuzzer and sanitizers for longer
// campaigns. A finding aborts (harness.h); the input that did it is written to fuzz-finding.bin in
// the current folder first.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fuzz/harness.h"
#include "fuzz/mutate.h"

namespace {

std::string g_current;  // the input being parsed, for the signal handler

void write_finding(int sig) {
  const int fd = ::open("fuzz-finding.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    ssize_t left = static_cast<ssize_t>(g_current.size());
    const char* p = g_current.data();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, static_cast<std::size_t>(left));
      if (n <= 0) break;
      p += n;
      left -= n;
    }
    ::close(fd);
  }
  static const char msg[] = "fuzz: the input is in fuzz-finding.bin\n";
  [[maybe_unused]] ssize_t w = ::write(2, msg, sizeof(msg) - 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void run(const std::string& input) {
  g_current = input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = 0;
  unsigned long long seed = 1;
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mutations" && i + 1 < argc) {
      mutations = std::strtol(argv[++i], nullptr, 10);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--help" || a.rfind("-", 0) == 0) {
      std::fprintf(stderr, "usage: %s [--mutations N] [--seed S] FILE_OR_FOLDER...\n", argv[0]);
      return a == "--help" ? 0 : 2;
    } else if (std::filesystem::is_directory(a)) {
      for (const auto& e : std::filesystem::directory_iterator(a))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.emplace_back(a);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "no seed inputs given\n");
    return 2;
  }
  // A timeout is a finding too, as libFuzzer counts it (10 s per input): SIGALRM writes the input.
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGALRM}) std::signal(sig, write_finding);
  long inputs = 0;
  for (std::size_t f = 0; f < files.size(); ++f) {
    std::ifstream in(files[f], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", files[f].c_str());
      return 2;
    }
    const std::string seed_input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto timed = [](const std::string& input) {
      ::alarm(10);
      run(input);
      ::alarm(0);
    };
    timed(seed_input);
    ++inputs;
    std::mt19937_64 rng(seed * 1000003ull + f);
    for (long m = 0; m < mutations; ++m, ++inputs) timed(slidedp::fuzz::mutate(seed_input, rng));
  }
  std::printf("%s: %ld inputs (%zu seeds, %ld mutations each), no finding\n", argv[0], inputs, files.size(), mutations);
  return 0;
}
