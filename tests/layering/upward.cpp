// Compiled by ctest with the include view of the tasks layer: an include of a higher layer
// (bench) must not be found. The test `layering_upward_include_fails` expects this to fail.
#include "bench/results/result.hpp"
