// attnbench list: mechanisms, one mechanism's parameters, tasks, or a point's fields.
#include <memory>

#include "bench/engine/list.hpp"
#include "bench/text/text_table.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct ListOptions {
  std::string what = "mechanisms", name, data_dir, format = "text";
  bool wide = false;
};

VerbMain add_list(CLI::App& app, SharedOptions&) {
  auto o = std::make_shared<ListOptions>();
  app.add_option("what", o->what, "mechanisms | params | tasks | fields")->capture_default_str();
  app.add_option("name", o->name, "mechanism name (for params)");
  app.add_option("--data-dir", o->data_dir, "tasks: show what this directory provides");
  app.add_flag("--wide", o->wide, "every column in full (default: fitted to 100 columns)");
  app.add_option("--format", o->format, "text | json (json: list fields, for scripts)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  return [o](const std::string&) {
    return cmd_list(o->what, o->what == "tasks" ? o->data_dir : o->name, o->wide ? 0 : kDefaultTableWidth, o->format == "json");
  };
}

}  // namespace

Verb list_verb() {
  return {"list", "list mechanisms, one mechanism's parameters, tasks, or a point's fields",
          {"attnbench list", "attnbench list params reformer", "attnbench list tasks --data-dir /usr/share/datasets/fashion-mnist",
           "attnbench list fields --format json"},
          add_list};
}

}  // namespace ab
