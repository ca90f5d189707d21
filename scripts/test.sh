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
# ctest pads every result line to its longest test name (111 characters: 180-column lines). Each
# result line is printed instead as count, status, seconds and the name, cut to the terminal's
# width (COLUMNS, else 100); the "Start" lines are left out; failure output and the summary are
# printed as ctest writes them. The exit code is ctest's.
# shellcheck disable=SC2086
ctest --output-on-failure -j 2 --timeout 900 ${ATTNBENCH_CTEST_ARGS:-} 2>&1 | awk -v width="${COLUMNS:-100}" '
  /^ +Start +[0-9]+: / { next }
  /^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: / {
    status = ""; secs = ""
    for (i = 5; i <= NF; i++) {
      sub(/^\.+/, "", $i)  # the padding dots, alone or before ***Failed
      if ($i == "") continue
      if ($i == "sec") break
      if ($i ~ /^[0-9]+\.[0-9]+$/) secs = $i; else status = status (status == "" ? "" : " ") $i
    }
    line = sprintf("%9s %-9s %7s s  %s", $1, status, secs, $4)
    if (length(line) > width) line = substr(line, 1, width - 3) "..."
    print line
    fflush()
    next
  }
  { print; fflush() }'
