#include "bench/results/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <set>
#include <sstream>

#include "bench/results/accuracy_table.hpp"
#include "bench/process/process.hpp"
#include "bench/results/result_writer.hpp"
#include "bench/results/table.hpp"
#include "core/files.hpp"
#include "tasks/task.hpp"

namespace ab {

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string base64_encode(const std::string& bytes) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string o;
  o.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t b0 = static_cast<unsigned char>(bytes[i]);
    const uint32_t b1 = i + 1 < bytes.size() ? static_cast<unsigned char>(bytes[i + 1]) : 0;
    const uint32_t b2 = i + 2 < bytes.size() ? static_cast<unsigned char>(bytes[i + 2]) : 0;
    const uint32_t v = b0 << 16 | b1 << 8 | b2;
    o += k[v >> 18 & 63];
    o += k[v >> 12 & 63];
    o += i + 1 < bytes.size() ? k[v >> 6 & 63] : '=';
    o += i + 2 < bytes.size() ? k[v & 63] : '=';
  }
  return o;
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(fmt::format("cannot read {}", path));
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

namespace {

// `text` with `inline code` spans as <code>, the rest escaped (an unmatched backtick is text).
std::string inline_html(const std::string& text) {
  std::string o;
  size_t from = 0;
  for (size_t open = text.find('`'); open != std::string::npos; open = text.find('`', from)) {
    const size_t close = text.find('`', open + 1);
    if (close == std::string::npos) break;
    o += html_escape(text.substr(from, open - from)) + "<code>" + html_escape(text.substr(open + 1, close - open - 1)) + "</code>";
    from = close + 1;
  }
  return o + html_escape(text.substr(from));
}

std::vector<std::string> pipe_cells(const std::string& line) {
  std::string s = line;
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
  if (!s.empty() && s.front() == '|') s.erase(0, 1);
  if (!s.empty() && s.back() == '|') s.pop_back();
  std::vector<std::string> cells;
  std::stringstream ss(s);
  std::string c;
  while (std::getline(ss, c, '|')) {
    const size_t a = c.find_first_not_of(' '), b = c.find_last_not_of(' ');
    cells.push_back(a == std::string::npos ? "" : c.substr(a, b - a + 1));
  }
  return cells;
}

bool is_separator(const std::vector<std::string>& cells) {
  return !cells.empty() && std::all_of(cells.begin(), cells.end(), [](const std::string& c) {
           return !c.empty() && c.find_first_not_of("-: ") == std::string::npos;
         });
}

// A pipe table's lines as a sortable table: the first row the head, the `---:` columns numbers.
std::string table_html(const std::vector<std::string>& lines) {
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> right;
  for (const auto& l : lines) {
    auto cells = pipe_cells(l);
    if (rows.size() == 1 && is_separator(cells)) {
      for (const auto& c : cells) right.push_back(c.back() == ':');
      continue;
    }
    rows.push_back(std::move(cells));
  }
  std::string o = "<table class=\"sortable\">\n<thead><tr>";
  for (const auto& h : rows[0]) o += "<th title=\"sort\">" + inline_html(h) + "</th>";
  o += "</tr></thead>\n<tbody>\n";
  for (size_t r = 1; r < rows.size(); ++r) {
    o += "<tr>";
    for (size_t c = 0; c < rows[r].size(); ++c)
      o += (c < right.size() && right[c] ? "<td class=\"num\">" : "<td>") + inline_html(rows[r][c]) + "</td>";
    o += "</tr>\n";
  }
  return o + "</tbody>\n</table>\n";
}

}  // namespace

std::string markdown_to_html(const std::string& md) {
  std::vector<std::string> lines;
  {
    std::stringstream ss(md);
    std::string l;
    while (std::getline(ss, l)) lines.push_back(l);
  }
  std::string o;
  bool in_list = false;
  auto close_list = [&] {
    if (in_list) o += "</ul>\n";
    in_list = false;
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (l.empty()) {
      close_list();
      continue;
    }
    if (l.front() == '|') {
      close_list();
      std::vector<std::string> block;
      while (i < lines.size() && !lines[i].empty() && lines[i].front() == '|') block.push_back(lines[i++]);
      --i;
      o += table_html(block);
    } else if (l.size() > 4 && l.rfind("**", 0) == 0 && l.substr(l.size() - 2) == "**") {
      close_list();
      o += "<h4>" + inline_html(l.substr(2, l.size() - 4)) + "</h4>\n";
    } else if (l.rfind("#", 0) == 0) {
      close_list();
      const size_t level = l.find_first_not_of('#');
      o += fmt::format("<h{0}>{1}</h{0}>\n", std::min<size_t>(6, level + 2), inline_html(l.substr(l.find_first_not_of("# "))));
    } else if (l.rfind("- ", 0) == 0) {
      if (!in_list) o += "<ul>\n";
      in_list = true;
      o += "<li>" + inline_html(l.substr(2)) + "</li>\n";
    } else {
      close_list();
      o += "<p>" + inline_html(l) + "</p>\n";
    }
  }
  close_list();
  return o;
}

namespace {

constexpr const char* kStyle = R"(body{font-family:sans-serif;margin:1.5em auto;max-width:80em;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;margin-top:2em}h4{margin:1.4em 0 .4em}
table{border-collapse:collapse;margin:.3em 0 1em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.2em .5em;vertical-align:top}
th{background:#f2f2f2;cursor:pointer;user-select:none}th[data-dir=asc]::after{content:" \25B2"}
th[data-dir=desc]::after{content:" \25BC"}td.num{text-align:right;font-variant-numeric:tabular-nums}
code,td.cmd{font-family:monospace;font-size:.85em}td.cmd{word-break:break-all;max-width:50em}
img{max-width:100%;border:1px solid #eee}.missing{color:#a40}.meta td:first-child{font-weight:bold}
nav li{margin:.2em 0})";

// Sorting by a click on a column head (numbers by value, the rest as text); when the page has
// loaded, the counts of tables and of images that decoded, as attributes of <body> (what the
// browser test reads).
constexpr const char* kScript = R"((function () {
  function key(cell) {
    var t = cell ? cell.textContent.trim() : '';
    var x = parseFloat(t.replace(/,/g, ''));
    return isNaN(x) ? t.toLowerCase() : x;
  }
  var tables = document.querySelectorAll('table.sortable');
  for (var ti = 0; ti < tables.length; ++ti) {
    (function (table) {
      var heads = table.tHead ? table.tHead.rows[0].cells : [];
      for (var c = 0; c < heads.length; ++c) {
        (function (th, col) {
          th.addEventListener('click', function () {
            var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
            var dir = th.getAttribute('data-dir') === 'asc' ? -1 : 1;
            rows.sort(function (a, b) {
              var x = key(a.cells[col]), y = key(b.cells[col]);
              if (typeof x !== typeof y) { x = String(x); y = String(y); }
              return x < y ? -dir : x > y ? dir : 0;
            });
            for (var r = 0; r < rows.length; ++r) body.appendChild(rows[r]);
            for (var h = 0; h < heads.length; ++h) heads[h].removeAttribute('data-dir');
            th.setAttribute('data-dir', dir === 1 ? 'asc' : 'desc');
          });
        })(heads[c], c);
      }
    })(tables[ti]);
  }
  window.addEventListener('load', function () {
    var loaded = 0;
    for (var i = 0; i < document.images.length; ++i)
      if (document.images[i].complete && document.images[i].naturalWidth > 0) ++loaded;
    document.body.setAttribute('data-tables', String(document.querySelectorAll('table').length));
    document.body.setAttribute('data-images', String(document.images.length));
    document.body.setAttribute('data-images-loaded', String(loaded));
    // #sort-check (the browser test): sort the first table with numbers by its first number
    // column, both ways, and say whether the rows came out in order.
    if (location.hash !== '#sort-check') return;
    var result = 'no numeric column';
    for (var t = 0; t < tables.length && result === 'no numeric column'; ++t) {
      var tb = tables[t], cells = tb.tBodies[0].rows.length > 1 ? tb.tBodies[0].rows[0].cells : [];
      for (var c = 0; c < cells.length; ++c) {
        if (cells[c].className !== 'num' || typeof key(cells[c]) !== 'number') continue;
        var ok = true;
        for (var pass = 0; pass < 2; ++pass) {
          tb.tHead.rows[0].cells[c].click();
          var rows = tb.tBodies[0].rows;
          for (var r = 1; r < rows.length; ++r) {
            var x = key(rows[r - 1].cells[c]), y = key(rows[r].cells[c]);
            if (typeof x === 'number' && typeof y === 'number' && (pass === 0 ? x > y : x < y)) ok = false;
          }
        }
        result = ok ? 'ok' : 'out of order';
        break;
      }
    }
    document.body.setAttribute('data-sort-check', result);
  });
})();)";

// The context fields a reader wants first: the machine, the build, when and how.
const char* const kMachineFields[] = {"cpu_model", "cpu_isa", "num_cpus", "machine_id", "mhz_per_cpu",
                                      "gemm_gflops_per_s_1thread", "onednn_version", "compiler", "flags",
                                      "attnbench_version", "git_commit", "date", "command"};

std::string context_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt::format("{:.4g}", v.get<double>());
  return v.dump();
}

bool is_lra_task(const std::string& task) {
  return task == "listops" || task == "text" || task == "retrieval" || task == "image" || task == "pathfinder";
}

// A section of the page that failed to draw says why in its place, instead of failing the page.
template <class F>
std::string or_note(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return "<p class=\"missing\">" + html_escape(what) + ": " + html_escape(e.what()) + "</p>\n";
  }
}

std::string file_section(const ResultFile& f, size_t index, const ReportOptions& o,
                         const std::function<std::string(const std::string&)>& plot_png) {
  std::string s = fmt::format("<section id=\"file-{}\">\n<h2>{}</h2>\n", index, html_escape(f.path));
  s += "<table class=\"meta\">\n<tbody>\n";
  for (const char* k : kMachineFields)
    if (f.context.contains(k))
      s += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", k, html_escape(context_text(f.context.at(k))));
  s += "</tbody>\n</table>\n";
  ResultFile timed{f.path, f.context, {}}, trained{f.path, f.context, {}};
  for (const auto& p : f.points) (p.train ? trained : timed).points.push_back(p);
  if (!timed.points.empty()) {
    std::set<std::string> mechs;
    for (const auto& p : timed.points) mechs.insert(p.id.mechanism);
    const std::string base = mechs.count("flash") ? "flash" : mechs.count("vanilla") ? "vanilla" : "none";
    const bool any_error = std::any_of(timed.points.begin(), timed.points.end(), [](const PointResult& p) { return p.nmse.has_value(); });
    s += "<h3>Time, rate and memory</h3>\n";
    std::vector<std::pair<std::string, std::string>> metrics = {{"time", base}, {"peak_fraction", "none"}, {"memory", base}};
    if (any_error) metrics.push_back({"nmse", "none"});
    for (const auto& [metric, baseline] : metrics)
      s += or_note("table " + metric, [&] {
        TableOptions t;
        t.metric = metric;
        t.baseline = baseline;
        return markdown_to_html(make_table({timed}, t));
      });
    if (o.plots)
      s += or_note("plot not drawn", [&] {
        return fmt::format("<p><img alt=\"{0}: time, memory and speed-up against N\" src=\"data:image/png;base64,{1}\"></p>\n",
                           html_escape(f.path), base64_encode(plot_png(f.path)));
      });
  }
  if (!trained.points.empty()) {
    const bool lra = std::any_of(trained.points.begin(), trained.points.end(), [](const PointResult& p) { return is_lra_task(p.id.task); });
    s += "<h3>Accuracy of the trained models</h3>\n";
    s += or_note("accuracy table", [&] { return markdown_to_html(accuracy_table({trained}, AccuracyTableOptions{"accuracy", "md", ""})); });
    if (lra)
      s += or_note("LRA table", [&] {
        return "<h4>LRA Table 1's layout, the published rows under ours</h4>\n" +
               markdown_to_html(accuracy_table({trained}, AccuracyTableOptions{"accuracy", "md", "lra"}));
      });
  }
  s += "<h3>Every point and the command that reproduces it</h3>\n<table class=\"sortable\">\n<thead><tr><th>point</th>"
       "<th>status</th><th>median ms</th><th>accuracy</th><th>command</th></tr></thead>\n<tbody>\n";
  for (const auto& p : f.points) {
    const std::string ms = p.reps.empty() ? "" : fmt::format("{:.4g}", real_stats(p).median);
    const std::string acc = p.train ? fmt::format("{:.4f}", p.train->accuracy) : "";
    s += fmt::format("<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"cmd\">{}</td></tr>\n",
                     html_escape(p.id.name()), html_escape(std::string(to_string(p.status)) + (p.message.empty() ? "" : ": " + p.message)),
                     ms, acc, html_escape(p.label));
  }
  return s + "</tbody>\n</table>\n</section>\n";
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

}  // namespace

std::string html_page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + html_escape(title) +
         "</title>\n<style>\n" + kStyle + "\n</style>\n</head>\n<body>\n<h1>" + html_escape(title) + "</h1>\n" + body +
         "<script>\n" + kScript + "\n</script>\n</body>\n</html>\n";
}

std::string report_html(const std::vector<ResultFile>& files, const ReportOptions& o,
                        const std::function<std::string(const std::string&)>& plot_png) {
  std::string h;
  h += fmt::format("<p>Written {} from {} result file{}. Click a column head to sort a table.</p>\n<nav><ul>\n", now_utc(),
                   files.size(), files.size() == 1 ? "" : "s");
  for (size_t i = 0; i < files.size(); ++i)
    h += fmt::format("<li><a href=\"#file-{}\">{}</a> ({} points)</li>\n", i, html_escape(files[i].path), files[i].points.size());
  for (size_t i = 0; i < o.images.size(); ++i)
    h += fmt::format("<li><a href=\"#image-{}\">{}</a></li>\n", i, html_escape(o.images[i]));
  h += "</ul></nav>\n";
  for (size_t i = 0; i < files.size(); ++i) h += file_section(files[i], i, o, plot_png);
  for (size_t i = 0; i < o.images.size(); ++i)
    h += fmt::format("<section id=\"image-{0}\">\n<h2>{1}</h2>\n<p><img alt=\"{1}\" src=\"data:image/png;base64,{2}\"></p>\n</section>\n",
                     i, html_escape(o.images[i]), base64_encode(read_file_bytes(o.images[i])));
  return html_page(o.title, h);
}

int cmd_report(const std::vector<std::string>& paths, const ReportOptions& o) {
  namespace fs = std::filesystem;
  for (const auto& img : o.images) {
    require_regular_file(img);
    const std::string head = read_file_bytes(img).substr(0, 8);
    if (head != std::string("\x89PNG\r\n\x1a\n", 8)) throw InvalidInput(fmt::format("--image {}: not a PNG file", img));
  }
  const auto files = read_result_files(paths);
  require_points(files);
  make_directory("--out", o.out_dir);
  const std::string page = (fs::path(o.out_dir) / "index.html").string();
  std::vector<std::string> inputs = paths;
  inputs.insert(inputs.end(), o.images.begin(), o.images.end());
  refuse_overwriting_inputs(page, inputs);
  prepare_output_path(page, o.force);
  // The plots: scripts/plot.py of this source tree on each timed file, into a scratch directory
  // this process makes and removes.
  std::string scratch;
  int plot_count = 0;
  auto plot_png = [&](const std::string& path) {
    const std::string script = std::string(ATTNBENCH_SOURCE_DIR) + "/scripts/plot.py";
    if (!fs::exists(script)) throw std::runtime_error(script + " is not there (the report draws plots with this source tree's script)");
    if (scratch.empty()) scratch = make_scratch_dir("report");
    const std::string prefix = fmt::format("{}/plot{}", scratch, plot_count++);
    const ChildOutcome c = run_child({"/usr/bin/python3", script, path, prefix, "--attnbench", self_executable()}, prefix + ".out",
                                     prefix + ".err", 600, nullptr);
    if (c.kind != ChildOutcome::Exited || c.exit_code != 0)
      throw std::runtime_error(fmt::format("scripts/plot.py: {}: {}", c.describe(), last_line_of(prefix + ".err")));
    return read_file_bytes(prefix + ".png");
  };
  std::string html;
  try {
    html = report_html(files, o, plot_png);
  } catch (...) {
    if (!scratch.empty()) fs::remove_all(scratch);
    throw;
  }
  if (!scratch.empty()) fs::remove_all(scratch);
  write_file_atomic(page, html);
  std::cout << page << "\n";
  return 0;
}

}  // namespace ab
