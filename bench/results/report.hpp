// `attnbench report`: result files as one self-contained static HTML page (no network, no
// external script, style sheet or font): per file the machine and the command, every table
// `attnbench table` draws for its points (time, fraction of the GEMM rate, memory and error for
// timed points; accuracy, and LRA Table 1's layout with the published rows when the runs are
// LRA tasks, for training runs), the plots of scripts/plot.py embedded as PNG, and every point
// with its status and the command that reproduces it. Tables sort by a click on a column head.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "bench/results/result_reader.hpp"

namespace ab {

struct ReportOptions {
  std::string out_dir;              // the page is OUT_DIR/index.html
  bool force = false;               // replace an index.html a report did not just write
  bool plots = true;                // draw the timed files' plots (needs /usr/bin/python3 with matplotlib)
  std::vector<std::string> images;  // further PNG files to embed (learning curves, frontiers)
  std::string title = "attnbench report";
};

// The page's HTML for the files; `plot_png(path)` returns the PNG bytes of a timed file's plot,
// or throws std::runtime_error saying why there is none (the page then says so in its place).
std::string report_html(const std::vector<ResultFile>& files, const ReportOptions& o,
                        const std::function<std::string(const std::string&)>& plot_png);

// Markdown (the tables `table` prints: **title** lines, pipe tables, "- " notes, paragraphs) as
// HTML, every text escaped; pipe tables become sortable <table> elements.
std::string markdown_to_html(const std::string& md);

int cmd_report(const std::vector<std::string>& paths, const ReportOptions& o);

// The pieces the history page shares: text escaped for HTML, bytes as base64, and a whole page
// (the report's style sheet and sorting script around `body`, the title as its heading).
std::string html_escape(const std::string& s);
std::string base64_encode(const std::string& bytes);
// A whole file's bytes (std::runtime_error naming it when it cannot be read).
std::string read_file_bytes(const std::string& path);
std::string html_page(const std::string& title, const std::string& body);

}  // namespace ab
