// `attnbench list`: the registered mechanisms, one mechanism's parameters, or the tasks.
#pragma once
#include <string>

namespace ab {

int cmd_list(const std::string& what, const std::string& name);

}  // namespace ab
