#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test through ctest.
# usage: scripts/test.sh [BUILD_DIR] [extra cmake args...]
# ATTNBENCH_CTEST_ARGS adds ctest arguments (CI: "-LE tools" for the sanitizer build).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
"$root/scripts/setup.sh" --tests
"$root/scripts/build.sh" "$build" "$@"
cd "$build"
# shellcheck disable=SC2086
ctest --output-on-failure -j 2 --timeout 900 ${ATTNBENCH_CTEST_ARGS:-}
