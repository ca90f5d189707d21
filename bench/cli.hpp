// The `attnbench` command line: the verbs' options (CLI11) and their dispatch. The verbs live in
// their own files: list, run, sweep, table, compare, merge, dump, task.
#pragma once

namespace ab {

// Returns the process exit code: 0 success, 2 bad input (one-line message on stderr), 1 other
// failures (and, for `compare`, a regression).
int cli_main(int argc, char** argv);

}  // namespace ab
