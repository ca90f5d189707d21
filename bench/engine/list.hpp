// `attnbench list`: the registered mechanisms, one mechanism's parameters, the tasks, or the
// fields of a point's identity (its name's segments; `--format json` for scripts).
#pragma once
#include <string>

namespace ab {

// width: the tables' (0: every column in full). json: the fields as JSON (`list fields` only).
int cmd_list(const std::string& what, const std::string& name, int width, bool json = false);

}  // namespace ab
