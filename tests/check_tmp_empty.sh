#!/usr/bin/env bash
# The last test: every test ran with TMPDIR=DIR; whatever is left there was left by a test.
# usage: tests/check_tmp_empty.sh DIR
set -euo pipefail
dir="$1"
[ -d "$dir" ] || { echo "check_tmp_empty: $dir does not exist (the fixture that makes it did not run)" >&2; exit 1; }
left="$(find "$dir" -mindepth 1 -maxdepth 1 | sort)"
if [ -n "$left" ]; then
  echo "the tests left $(printf '%s\n' "$left" | wc -l) entries in $dir:" >&2
  printf '%s\n' "$left" | head -20 >&2
  exit 1
fi
echo "nothing left in $dir"
