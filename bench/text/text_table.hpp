// Markdown tables for a terminal: the columns every row agrees on move to a title line, and what
// is still too wide is cut, so a table fits the width it is given (100 columns by default; --wide
// shows everything).
#pragma once
#include <set>
#include <string>
#include <vector>

namespace ab {

struct TextTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::set<size_t> right_aligned;  // columns of numbers
  std::set<size_t> keep;           // columns that stay in the table even when every row agrees
  std::set<size_t> movable;        // the only columns that may move to the title (empty: any)
};

constexpr int kDefaultTableWidth = 100;

// The table as markdown. width 0: as it is. Otherwise: every movable column whose cells are all
// equal (and not in `keep`) becomes "header value" on a title line above the table (an empty one
// is dropped; with one row, that is every movable column); then, while a line is wider than `width`, the widest column's cells
// (and header) are cut with "…", down to 6 columns; the title line is wrapped at `width`.
std::string render_markdown(const TextTable& t, int width);

}  // namespace ab
