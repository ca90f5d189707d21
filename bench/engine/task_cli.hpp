// The task verbs: `list tasks`, `task sample` (examples a person can read, JSON lines with the
// token ids, or the class counts of a split: the accuracy of always answering its commonest class)
// and `task rate` (how fast a task generates its batches).
#pragma once
#include <string>

#include "tasks/task.hpp"

namespace ab {

struct TaskCliOptions {
  std::string task;
  TaskOptions task_opts;
  int64_t count = 3;
  int64_t first = 0;
  std::string split = "train";  // train | val | test: the stream the trainer draws that split from
  std::string format = "md";  // md (readable) | jsonl (one object per example) | labels (class counts)
  int64_t scale = 1;          // --png: pixels per image pixel
  std::string png_dir;
  int64_t batch = 0;  // rate: 0 = the task's LRA batch
  int reps = 5;
  int threads = 1;
};

int cmd_list_tasks(const TaskOptions& opts, int width);
int cmd_task_sample(const TaskCliOptions& o);
int cmd_task_rate(const TaskCliOptions& o);

}  // namespace ab
