#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test through ctest.
# usage: scripts/test.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
"$root/scripts/setup.sh" --tests
"$root/scripts/build.sh" "$build" "$@"
cd "$build"
ctest --output-on-failure -j 2 --timeout 900
