// Progress line with rate and ETA; see progress.h.
#include "common/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "common/units.h"

namespace slidedp {

Progress::Progress(std::string label, double total, std::string unit, bool enabled)
    : label_(std::move(label)),
      total_(total),
      unit_(std::move(unit)),
      enabled_(enabled),
      tty_(isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

void Progress::update(double done, const std::string& note) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  double since_print = std::chrono::duration<double>(now - last_print_).count();
  if (!tty_ && since_print < 5.0 && done < total_) return;
  if (tty_ && since_print < 0.1 && done < total_) return;
  last_print_ = now;
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double rate = elapsed > 0 ? done / elapsed : 0;
  double eta = rate > 0 ? (total_ - done) / rate : 0;
  std::string line = fmt::format("{}: {:.0f}/{:.0f} {} | {:.3g} {}/s | elapsed {} | ETA {}{}{}", label_,
                                 done, total_, unit_, rate, unit_, format_seconds(elapsed),
                                 format_seconds(eta), note.empty() ? "" : " | ", note);
  if (tty_)
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
  else
    std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

void Progress::finish(const std::string& note) {
  if (!enabled_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = fmt::format("{}: done in {}{}{}", label_, format_seconds(elapsed),
                                 note.empty() ? "" : " | ", note);
  if (tty_)
    std::fprintf(stderr, "\r\033[K%s\n", line.c_str());
  else
    std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace slidedp
