// `attnbench list`: the registered mechanisms, one mechanism's parameters, or the tasks.
#pragma once
#include <string>

namespace ab {

// width: the tables' (0: every column in full).
int cmd_list(const std::string& what, const std::string& name, int width);

}  // namespace ab
