// `attnbench train`: training runs to accuracy (model/trainer.hpp), one per point of the grid,
// with a JSON-lines learning curve, checkpoints, a one-line progress display, and a result entry
// per run (accuracy, val_accuracy, eval_loss, train_steps, train_seconds, steps_per_s, memory).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "bench/points/point.hpp"
#include "bench/results/result.hpp"
#include "model/trainer.hpp"

namespace ab {

struct TrainCliOptions {
  std::string checkpoint_dir;  // a directory per run: DIR, or DIR/<run> when the grid has several
  int64_t checkpoint_every = 0;
  bool resume = false;
  bool convert_dtype = false;  // --resume may continue this run's checkpoint from another --dtype
  std::string log_path;  // JSON lines, every run's lines naming their point
  int64_t log_every = 10;
  std::string out;       // the result file: created, or a result file the runs are added to
  std::string format = "md";  // stdout: md | json
  int width = 100;            // the stdout table's (0: every column)
};

// A run's own directory name under a shared checkpoint directory: readable, and unique (a hash
// of its name).
std::string run_directory_name(const PointId& id);

// Trains one point: its result (FAILED with the reason when training fails), or nullopt when
// interrupted (the checkpoint, if any, holds the progress). `curve` lines go to the log.
std::optional<PointResult> train_point(const PointId& id, const TrainCliOptions& o, const std::string& checkpoint_dir,
                                       const std::atomic<bool>* interrupt, std::unique_ptr<Trainer> built = nullptr);

// Returns the exit code: 0; 1 when a run is not OK or its result could not be added to --out
// (then it is on stdout); 130 when interrupted (Ctrl-C: a checkpoint is written first).
int cmd_train(const std::vector<PointId>& grid, const TrainCliOptions& o, const std::string& command);

}  // namespace ab
