// Fixed-width console tables with a units row, in the style of nccl-tests: a header row, a units row,
// then data. Columns right-align numbers and left-align text.
#pragma once

#include <string>
#include <vector>

namespace slidedp {

class Table {
 public:
  // Each column: title and unit ("" for none).
  Table(std::vector<std::string> titles, std::vector<std::string> units);
  void add_row(std::vector<std::string> cells);
  bool empty() const { return rows_.empty(); }
  std::string render() const;
  std::string render_markdown() const;

 private:
  std::vector<std::string> titles_;
  std::vector<std::string> units_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace slidedp
