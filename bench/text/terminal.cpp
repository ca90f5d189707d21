#include "bench/text/terminal.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>

namespace ab {

int terminal_columns(int fd) {
  if (!isatty(fd)) return 0;
  winsize w{};
  if (ioctl(fd, TIOCGWINSZ, &w) != 0 || w.ws_col == 0) return 80;
  return w.ws_col;
}

ProgressLine::ProgressLine() : tty(isatty(2) != 0) {}

void ProgressLine::message(const std::string& text) const {
  std::cerr << (tty ? wrap_words(text, std::max(1, terminal_columns(2) - 1), "  ") : text + "\n") << std::flush;
}

void ProgressLine::show(const std::string& line, bool final_line) const {
  if (tty) {
    const int width = terminal_columns(2);
    // One column short of the width: a line exactly as wide as the terminal wraps on some.
    std::cerr << "\r\033[K" << fit_columns(line, width > 1 ? width - 1 : 0) << (final_line ? "\n" : "") << std::flush;
  } else if (final_line) {
    std::cerr << line << "\n" << std::flush;
  }
}

int display_columns(const std::string& text) {
  int n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80 ? 1 : 0;  // count lead bytes only
  return n;
}

std::string fit_columns(const std::string& line, int width) {
  if (width <= 0 || display_columns(line) <= width) return line;
  std::string out;
  int cols = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(line[i]);
    const bool lead = (c & 0xC0) != 0x80;
    if (lead && cols == width - 1) break;  // room for the ellipsis
    cols += lead ? 1 : 0;
    out += line[i];
  }
  return out + "\u2026";
}

std::string wrap_words(const std::string& text, int width, const std::string& indent) {
  if (width <= 0) return text + "\n";
  std::string out, line;
  size_t at = 0;
  while (at < text.size()) {
    size_t sp = text.find(' ', at);
    const std::string word = text.substr(at, sp == std::string::npos ? std::string::npos : sp - at);
    if (!line.empty() && display_columns(line) + 1 + display_columns(word) > width) {
      out += line + "\n";
      line = indent;
    }
    line += (line.empty() || line == indent ? "" : " ") + word;
    // A word longer than the line (a point's name) is broken where the width ends.
    while (display_columns(line) > width) {
      size_t cut = 0;
      for (int cols = 0; cut < line.size(); ++cut) {
        const bool lead = (static_cast<unsigned char>(line[cut]) & 0xC0) != 0x80;
        if (lead && cols == width) break;
        cols += lead ? 1 : 0;
      }
      out += line.substr(0, cut) + "\n";
      line = indent + line.substr(cut);
      if (display_columns(indent) >= width) break;
    }
    at = sp == std::string::npos ? text.size() : sp + 1;
  }
  return out + line + "\n";
}

std::string format_duration(double s) {
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t % 3600 / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

}  // namespace ab
