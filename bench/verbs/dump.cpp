// attnbench dump: inputs, parameters and outputs of one call as .npy + config.json.
#include <iostream>
#include <memory>

#include "bench/engine/dump.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct DumpVerbOptions {
  GridOptions grid;
  std::string dir;
};

VerbMain add_dump(CLI::App& app, SharedOptions&) {
  auto o = std::make_shared<DumpVerbOptions>();
  o->grid.text["seq"] = "128";
  o->grid.text["heads"] = "2";
  o->grid.text["dhead"] = "16";
  o->grid.add_to(&app, GridOptions::Verb::dump);
  app.add_option("--out", o->dir, "output directory")->required();
  return [o](const std::string&) {
    if (o->grid.mechanism_list().size() != 1) throw InvalidInput("dump takes exactly one mechanism");
    const auto grid = o->grid.grid();
    if (grid.size() != 1) throw InvalidInput("dump takes exactly one value of each size and parameter");
    dump_point(grid[0], o->grid.seed(), o->dir);
    std::cout << o->dir << "\n";
    return 0;
  };
}

}  // namespace

Verb dump_verb() {
  return {"dump", "write inputs, parameters and outputs of one call as .npy + config.json",
          {"attnbench dump --attn performer --seq 128 --out perf_dump/", "attnbench dump --attn bigbird --param block=16 --seq 64 --causal --out bb/"},
          add_dump};
}

}  // namespace ab
