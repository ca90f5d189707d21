#!/usr/bin/env bash
# Every result file committed under results/ reads with this binary (`attnbench export`), so a
# change of the reader never strands the published figures: the hardening round's stricter
# context check once refused results/studies/lra-accuracy/lra-accuracy.json, whose 'resumed_by'
# entries an older binary wrote as plain commands.
# usage: tests/check_committed_results.sh ATTNBENCH_EXE SOURCE_DIR
set -uo pipefail
exe="$1"
root="$2"
checked=0 failed=0
while IFS= read -r -d '' f; do
  # Result files are Google Benchmark documents; other JSON (checkpoint headers, configs) is not.
  grep -q '"benchmarks"' "$f" || continue
  if ! out="$("$exe" export "$f" --format jsonl 2>&1 >/dev/null)"; then
    echo "FAIL $f: $out"
    failed=$((failed + 1))
  fi
  checked=$((checked + 1))
done < <(find "$root/results" -name '*.json' -print0)
echo "$checked result files read, $failed failed"
[ "$checked" -gt 20 ] && [ "$failed" -eq 0 ]
