#include "bench/text/text_table.hpp"

#include <algorithm>

#include "bench/text/terminal.hpp"

namespace ab {

namespace {
std::string row_text(const std::vector<std::string>& cells) {
  std::string s = "|";
  for (const auto& c : cells) s += " " + c + " |";
  return s;
}
}  // namespace

std::string render_markdown(const TextTable& t, int width) {
  std::vector<size_t> cols(t.header.size());
  for (size_t i = 0; i < cols.size(); ++i) cols[i] = i;
  std::string title;
  if (width > 0 && !t.rows.empty()) {
    std::vector<size_t> kept;
    for (size_t c : cols) {
      bool same = !t.keep.count(c) && (t.movable.empty() || t.movable.count(c)) && (t.rows.size() >= 2 || !t.movable.empty());
      for (const auto& r : t.rows) same = same && r[c] == t.rows.front()[c];
      if (!same) {
        kept.push_back(c);
      } else if (!t.rows.front()[c].empty()) {
        title += (title.empty() ? "" : " · ") + t.header[c] + " " + t.rows.front()[c];
      }
    }
    cols = kept;
  }
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows(t.rows.size());
  for (size_t c : cols) header.push_back(t.header[c]);
  for (size_t r = 0; r < t.rows.size(); ++r)
    for (size_t c : cols) rows[r].push_back(t.rows[r][c]);
  // Cut the widest column while a line is too wide: the width of a row is its cells' widths
  // plus 3 per column plus 1. A column is not cut below its header's width (up to 10 columns:
  // "median ms" stays readable), and never below 6; a table that still does not fit is left wider.
  if (width > 0) {
    std::vector<int> floor_w(header.size());
    for (size_t c = 0; c < header.size(); ++c) floor_w[c] = std::clamp(display_columns(header[c]), 6, 10);
    auto column_width = [&](size_t c) {
      int w = display_columns(header[c]);
      for (const auto& r : rows) w = std::max(w, display_columns(r[c]));
      return w;
    };
    for (;;) {
      int total = 1;
      size_t widest = 0;
      int widest_w = -1;
      for (size_t c = 0; c < header.size(); ++c) {
        const int w = column_width(c);
        total += w + 3;
        if (w > floor_w[c] && w > widest_w) widest_w = w, widest = c;
      }
      if (total <= width || widest_w < 0) break;
      const int target = std::max(floor_w[widest], widest_w - (total - width));
      header[widest] = fit_columns(header[widest], target);
      for (auto& r : rows) r[widest] = fit_columns(r[widest], target);
    }
  }
  std::string out;
  if (!title.empty()) {
    // Wrapped at `width` on the separators.
    const std::string sep = " · ";
    std::string line;
    size_t at = 0;
    while (at < title.size()) {
      size_t next = title.find(sep, at);
      const std::string part = title.substr(at, next == std::string::npos ? std::string::npos : next - at);
      if (!line.empty() && width > 0 && display_columns(line) + display_columns(sep) + display_columns(part) > width) {
        out += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : sep) + part;
      at = next == std::string::npos ? title.size() : next + sep.size();
    }
    out += line + "\n\n";
  }
  out += row_text(header) + "\n|";
  for (size_t c = 0; c < cols.size(); ++c) out += t.right_aligned.count(cols[c]) ? "---:|" : "---|";
  out += "\n";
  for (const auto& r : rows) out += row_text(r) + "\n";
  return out;
}

}  // namespace ab
