// attnbench merge: join result files (a sweep's shards) into one.
#include <memory>

#include "bench/results/merge.hpp"
#include "bench/results/result_writer.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct MergeVerbOptions {
  std::vector<std::string> files;
  std::string out;
  bool force = false, mixed_cpus = false;
};

VerbMain add_merge(CLI::App& app, SharedOptions&) {
  auto o = std::make_shared<MergeVerbOptions>();
  app.add_option("files", o->files, "result files")->required();
  app.add_option("--out", o->out, "the merged file")->required();
  app.add_flag("--force", o->force, "overwrite --out when it exists");
  app.add_flag("--allow-mixed-cpus", o->mixed_cpus, "merge files measured on different CPU models");
  return [o](const std::string& command) {
    refuse_overwriting_inputs(o->out, o->files);
    prepare_output_path(o->out, o->force);
    return cmd_merge(o->files, o->out, o->mixed_cpus, command);
  };
}

}  // namespace

Verb merge_verb() {
  return {"merge", "join result files (e.g. the shards of a sweep) into one", {"attnbench merge shard1.json shard2.json --out all.json"},
          add_merge};
}

}  // namespace ab
