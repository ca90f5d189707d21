#include "bench/cli.hpp"

int main(int argc, char** argv) { return ab::cli_main(argc, argv); }
