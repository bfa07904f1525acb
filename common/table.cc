// Console and markdown rendering of Table; see table.h.
#include "common/table.h"

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace slidedp {
namespace {

bool looks_numeric(const std::string& s) {
  return !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '-' || s[0] == '+');
}

}  // namespace

Table::Table(std::vector<std::string> titles, std::vector<std::string> units)
    : titles_(std::move(titles)), units_(std::move(units)) {
  SLIDEDP_CHECK(titles_.size() == units_.size());
}

void Table::add_row(std::vector<std::string> cells) {
  SLIDEDP_CHECK(cells.size() == titles_.size(), "row width differs from the header");
  rows_.push_back(std::move(cells));
}

std::string Table::render() const {
  std::vector<std::size_t> width(titles_.size());
  for (std::size_t c = 0; c < titles_.size(); ++c) {
    width[c] = std::max(titles_[c].size(), units_[c].size());
    for (const auto& r : rows_) width[c] = std::max(width[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells, bool header) {
    std::string out;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      std::string pad(width[c] - cells[c].size(), ' ');
      bool right = !header && looks_numeric(cells[c]);
      out += (c ? "  " : "") + (right ? pad + cells[c] : cells[c] + pad);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(titles_, true);
  bool any_unit = std::any_of(units_.begin(), units_.end(), [](const auto& u) { return !u.empty(); });
  if (any_unit) out += line(units_, true);
  for (const auto& r : rows_) out += line(r, false);
  return out;
}

std::string Table::render_markdown() const {
  auto row = [](const std::vector<std::string>& cells) {
    std::string out = "|";
    for (const auto& c : cells) out += " " + c + " |";
    return out + "\n";
  };
  std::vector<std::string> head;
  for (std::size_t c = 0; c < titles_.size(); ++c)
    head.push_back(units_[c].empty() ? titles_[c] : titles_[c] + " (" + units_[c] + ")");
  std::string out = row(head);
  out += row(std::vector<std::string>(titles_.size(), "---"));
  for (const auto& r : rows_) out += row(r);
  return out;
}

}  // namespace slidedp
