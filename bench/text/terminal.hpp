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
// line starting with `indent`, a word longer than a line broken at the width; ends with a newline.
std::string wrap_words(const std::string& text, int width, const std::string& indent);

// Progress on stderr. On a terminal: one status line redrawn in place (show(..., false)), cut to
// the terminal's width, read at every redraw so a resized window is followed, so it never wraps
// into a stale second row; a final line (show(..., true)) stays, fitted likewise. Elsewhere (a
// log file, a pipe): only final lines, whole.
struct ProgressLine {
  bool tty;
  ProgressLine();
  void show(const std::string& line, bool final_line) const;
  // A message (a summary, a warning): whole on a log, wrapped at the width on a terminal.
  void message(const std::string& text) const;
};

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace ab
