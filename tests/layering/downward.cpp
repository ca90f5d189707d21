// Compiled by ctest with the include view of the tasks layer: its own and a lower layer's headers
// are found (so that `layering_upward_include_fails` fails for the right reason).
#include "core/params.hpp"
#include "tasks/task.hpp"
