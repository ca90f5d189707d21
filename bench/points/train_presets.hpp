// The training presets: stated configurations of the published accuracy comparisons, at the
// scale this machine trains in hours.
//   copy          "Transformers are RNNs" (Katharopoulos et al. 2020), the causal copy task:
//                 softmax (flash), linear, and Reformer LSH with 1 and with 4 rounds
//   lra-accuracy  LRA Table 1 at CPU scale: every mechanism on ListOps, Text, Retrieval, Image,
//                 Pathfinder, one configuration per task (the PyTorch LRA ports' small model)
//   lra-knobs     the Transformer on lra-accuracy's Image and Pathfinder with 3x and 4x the
//                 steps, and on Image at twice the width: whether steps or model size close
//                 the targets it misses there
// A preset is a grid of training runs that `train --preset` runs through the sweep (isolated,
// resumable, shardable); its configuration table is in docs/reproductions.md.
#pragma once
#include <string>
#include <vector>

#include "bench/points/point.hpp"

namespace ab {

struct TrainPresetOptions {
  std::vector<std::string> mechanisms;  // empty: the preset's
  std::vector<std::string> tasks;       // empty: the preset's
  std::vector<int64_t> seeds;           // empty: the preset's
  std::string data_dir;                 // lra-accuracy, lra-knobs: the image task's real data (Fashion-MNIST)
  int threads = 2;
  Dtype dtype = Dtype::f32;  // bf16: every run's steps in bf16 (a name of its own, so a file of its own runs)
};

const std::vector<std::string>& train_presets();  // copy, lra-accuracy, lra-knobs
std::string train_preset_names();                  // "copy, lra-accuracy, lra-knobs"
bool is_train_preset(const std::string& name);
// The preset's runs, in the order they are worth having: the comparisons' rows first, then the
// rest of the grid, then the extra seeds. Throws InvalidInput for an unknown preset, mechanism
// or task.
std::vector<PointId> train_preset_grid(const std::string& name, const TrainPresetOptions& o);
// The preset's configurations as timing points (`run --preset NAME`): each run without its
// recipe, so the same model, shape, batch, length, data and mechanism parameters, timed as a
// benchmark point (warm-up, repetitions, median) instead of read off a run that shared its
// core; one point per configuration (the seeds of a run are one). What the recipe adds to a
// step (dropout masks) is not in a timing point, for every mechanism alike.
std::vector<PointId> train_preset_timing_points(const std::string& name, const TrainPresetOptions& o);
// The --data-dir a preset's runs of `task` use ("" for a generator).
std::string train_preset_data_dir(const std::string& name, const std::string& task, const TrainPresetOptions& o);

}  // namespace ab
