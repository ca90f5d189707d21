// The `attnbench` command line: parsing (CLI11), the options verbs share, and the exit codes.
// Each verb is a table entry in its own file under bench/verbs/ (name, summary, examples, its
// options, what runs it), registered in one list (bench/verbs/verbs.cpp); the work itself is in
// the verbs' engines in bench/ (run.cpp, sweep.cpp, train.cpp, table.cpp, ...).
#pragma once

namespace ab {

// Returns the process exit code: 0 success, 2 bad input (one-line message on stderr), 1 other
// failures (and, for `compare`, a regression).
int cli_main(int argc, char** argv);

}  // namespace ab
