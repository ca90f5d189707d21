// The accuracy side of a comparison, in LRA Table 1's layout: rows mechanisms, columns tasks, an
// average column; each cell the mean (and spread) over the seeds of one configuration.
#pragma once
#include <string>
#include <vector>

#include "bench/results/result_reader.hpp"

namespace ab {

// Whether `metric` is a training run's quality metric (accuracy, val_accuracy, final_accuracy,
// token_accuracy, eval_loss): `table` then draws this layout.
bool is_accuracy_metric(const std::string& metric);

struct AccuracyTableOptions {
  std::string metric = "accuracy";
  std::string format = "md";  // md | csv | latex
  // Published rows to print beside ours ("lra": LRA's Table 1, published.md, in its layout: a row
  // for every mechanism and a column for each of LRA's five tasks, run or not), "" for none.
  std::string published;
};

// The table of every training run in the files. Points of one cell (mechanism, task) must differ
// in their seed only; two configurations in one cell is an error (InvalidInput) rather than a
// silent average. A cell without a run reads "not run"; a failed run its status.
std::string accuracy_table(const std::vector<ResultFile>& files, const AccuracyTableOptions& o);

}  // namespace ab
