// The terminal a progress line is drawn on: its width, and a line fitted to it.
#pragma once
#include <string>

namespace ab {

// The width in columns of the terminal on file descriptor `fd` (TIOCGWINSZ), or 0 when `fd` is
// not a terminal (then progress is written as plain lines).
int terminal_columns(int fd);

// `line` cut to at most `width` columns (UTF-8 aware: one column per code point), the cut marked
// with "…". width 0: unchanged.
std::string fit_columns(const std::string& line, int width);

// The number of columns `text` takes (one per UTF-8 code point).
int display_columns(const std::string& text);

// `text` wrapped at spaces into lines of at most `width` columns (0: one line), each continuation
// line starting with `indent`; ends with a newline.
std::string wrap_words(const std::string& text, int width, const std::string& indent);

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace ab
