#!/usr/bin/env bash
# The performance gate CI runs after the tests, against the baselines committed in results/ci/:
#  1. instruction counts (a build without AVX-512, each point under valgrind's callgrind, one
#     call counted): deterministic, so a tight threshold (1%);
#  2. wall time of a few points of a few milliseconds each, 7 repetitions, Mann-Whitney U test:
#     a wide threshold (50%, p < 0.01), so a shared machine's noise does not fail the build but
#     a real slowdown does. Tracked peak memory is checked with the same threshold.
# usage: scripts/perf_gate.sh            compare against results/ci/*.json (exit 1 on regression)
#        scripts/perf_gate.sh --record   measure and rewrite the baselines (after an intended change)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
record=0
[ "${1:-}" = "--record" ] && record=1
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
"$root/scripts/build.sh" "$root/build-count" -DATTNBENCH_ARCH=x86-64-v3 -DATTNBENCH_BUILD_TESTS=OFF \
  -DATTNBENCH_BUILD_MICROBENCH=OFF
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$root/build-count/attnbench" sweep --attn all --seq 256 --heads 2 --dhead 64 --reps 1 --min-time 0 \
  --count instructions --out "$work/instructions.json"
"$root/build/attnbench" sweep --attn flash,vanilla,local,bigbird,linformer,linear,performer --seq 2048 \
  --heads 4 --dhead 64 --reps 7 --min-time 0.05 --out "$work/time.json"

if [ "$record" = 1 ]; then
  cp "$work/instructions.json" "$work/time.json" "$root/results/ci/"
  echo "perf_gate: baselines rewritten in results/ci/" >&2
  exit 0
fi
status=0
echo "== instruction counts against results/ci/instructions.json (max +1%)" >&2
"$root/build/attnbench" compare "$root/results/ci/instructions.json" "$work/instructions.json" \
  --metric instructions --max-regress 0.01 || status=1
echo "== wall time and tracked memory against results/ci/time.json (max +50%, p < 0.01)" >&2
"$root/build/attnbench" compare "$root/results/ci/time.json" "$work/time.json" \
  --metric time --max-regress 0.5 --alpha 0.01 || status=1
exit $status
