#include "bench/list.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>

#include "attention_impls/registry.hpp"
#include "bench/task_cli.hpp"

namespace ab {

int cmd_list(const std::string& what, const std::string& name) {
  if (what == "mechanisms") {
    std::string out = "| mechanism | family | exact | causal | backward | decode | attn dropout | complexity | summary |\n"
                      "|---|---|---|---|---|---|---|---|---|\n";
    std::string notes;
    for (const auto& m : mechanisms()) {
      out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", m.name, m.family,
                         m.caps.exact ? "exact" : "approximate", m.caps.causal ? "yes" : "no",
                         m.caps.backward ? "yes" : "no", m.caps.decode ? "yes" : "no",
                         m.caps.attn_dropout ? "yes" : "no", m.complexity, m.summary);
      if (!m.caps.attn_dropout) notes += fmt::format("- {}: no attention dropout: {}\n", m.name, m.caps.no_attn_dropout);
    }
    std::cout << out << (notes.empty() ? "" : "\n" + notes);
    return 0;
  }
  if (what == "params") {
    if (name.empty()) throw InvalidInput(fmt::format("list params needs a mechanism name; known: {}", fmt::join(mechanism_names(), ", ")));
    const auto& m = find_mechanism(name);
    if (m.params.empty()) {
      std::cout << m.name << " has no parameters\n";
      return 0;
    }
    std::string out = "| parameter | default | allowed | meaning |\n|---|---|---|---|\n";
    for (const auto& p : m.params)
      out += fmt::format("| {} | {} | {} | {} |\n", p.name, format_param_value(p.def), p.describe_range(), p.help);
    std::cout << out;
    return 0;
  }
  if (what == "tasks") {
    TaskOptions o;
    o.data_dir = name;
    return cmd_list_tasks(o);
  }
  throw unknown_name("list", what, {"mechanisms", "params", "tasks"}, "lists");
}

}  // namespace ab
