// `attnbench history`: results across commits, as airspeed velocity keeps them. A history is one
// SQLite file holding one table, `results`, in the long schema of `attnbench export` (a row per
// entry of a result file: every field flattened to a dotted column, the context's machine_id,
// git_commit, cpu_model and date), plus `history_run`, a digest of the file's bytes that names
// the addition (a file added twice is recorded once), and `history_added`, when it was added.
// Columns a new file brings are added to the table.
//
// `history report` draws, per machine and per group of points (a shape, a mode, a thread count),
// each point's median time against the runs in date order, a line per mechanism and N, with the
// regressions the regression gate would report (slower by more than max_regress, Mann-Whitney U
// on the repetitions of one run against the previous run of the point, p < alpha) marked, as one
// self-contained HTML page with a table of those regressions.
#pragma once
#include <string>
#include <vector>

namespace ab {

struct HistoryOptions {
  std::string db = "history.db";
  std::string out_dir;       // report: the page is OUT_DIR/index.html
  bool force = false;        // report: replace an existing index.html
  double max_regress = 0.05;
  double alpha = 0.05;
};

// Adds the files' entries; returns how many files were new (the others were already there).
int history_add(const std::vector<std::string>& files, const HistoryOptions& o);

// One point's series on one machine: its runs in date order.
struct HistorySeries {
  std::string machine, group, label;  // label: mechanism (and parameters) and N
  struct Run {
    std::string commit, date, run;
    double median_ms = 0;
    std::vector<double> reps_ms;
    bool regression = false;  // slower than the previous run by the gate's rule
    double change = 0, p = 1;
  };
  std::vector<Run> runs;
};
std::vector<HistorySeries> history_series(const HistoryOptions& o);

int cmd_history_add(const std::vector<std::string>& files, const HistoryOptions& o);
int cmd_history_report(const HistoryOptions& o);

}  // namespace ab
