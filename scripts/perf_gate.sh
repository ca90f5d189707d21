#!/usr/bin/env bash
# The performance gate CI runs after the tests, against the baselines committed in results/ci/:
#  1. instruction counts (a build without AVX-512, each point under valgrind's callgrind, one
#     call counted): deterministic, so a tight threshold (1%);
#  2. wall time of a few points of a few milliseconds each, 7 repetitions, Mann-Whitney U test:
#     a wide threshold (50%, p < 0.01), so a shared machine's noise does not fail the build but
#     a real slowdown does. Times are compared in units of the GEMM rate each run measured
#     (compare --per-gemm): a host that is uniformly slower today (a busy neighbour, a lower
#     clock) cancels out, a slower kernel does not. A regression is measured a second time after
#     a pause, and only one that holds in both runs fails the gate (a burst of load on a shared
#     host slows every point of one run at once). Tracked peak memory is checked with the same
#     threshold. Wall times are only comparable on one kind of machine, so each kind has its own baseline,
#     results/ci/time-<machine_id>.json (machine_id as the result files' context writes it). On
#     a machine without one, only the tracked memory is compared (against any baseline), and the
#     gate says so.
# Each run's wall times are then added to the CI's history (ATTNBENCH_HISTORY; docs/cli.md).
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
  --instructions --out "$work/instructions.json"
time_sweep() {
  "$root/build/attnbench" sweep --attn flash,vanilla,local,bigbird,linformer,linear,performer --seq 2048 \
    --heads 4 --dhead 64 --reps 7 --min-time 0.05 --out "$1"
}
time_sweep "$work/time.json"

machine="$(grep -o '"machine_id": *"[^"]*"' "$work/time.json" | head -1 | sed 's/.*"\([^"]*\)"$/\1/')"
[ -n "$machine" ] || { echo "perf_gate: $work/time.json names no machine_id" >&2; exit 2; }
time_base="$root/results/ci/time-$machine.json"

if [ "$record" = 1 ]; then
  cp "$work/instructions.json" "$root/results/ci/instructions.json"
  cp "$work/time.json" "$time_base"
  echo "perf_gate: baselines rewritten: results/ci/instructions.json, results/ci/time-$machine.json" >&2
  exit 0
fi
status=0
echo "== instruction counts against results/ci/instructions.json (max +1%)" >&2
"$root/build/attnbench" compare "$root/results/ci/instructions.json" "$work/instructions.json" \
  --metric instructions --max-regress 0.01 || status=1
if [ -f "$time_base" ]; then
  echo "== wall time and tracked memory against results/ci/time-$machine.json (max +50%, p < 0.01)" >&2
  if ! "$root/build/attnbench" compare "$time_base" "$work/time.json" --metric time --per-gemm --max-regress 0.5 \
      --alpha 0.01; then
    echo "== a wall-time regression: measured again after 30 s; the gate fails only if it holds" >&2
    sleep 30
    time_sweep "$work/time-again.json"
    "$root/build/attnbench" compare "$time_base" "$work/time-again.json" --metric time --per-gemm --max-regress 0.5 \
      --alpha 0.01 || status=1
  fi
else
  other="$(ls "$root"/results/ci/time-*.json 2>/dev/null | head -1)"
  echo "== no wall-time baseline for this machine ($machine; recorded: $(cd "$root/results/ci" && ls time-*.json 2>/dev/null | tr '\n' ' '))." >&2
  echo "   Wall time is NOT gated here; scripts/perf_gate.sh --record adds this machine's baseline." >&2
  if [ -n "$other" ]; then
    echo "== tracked memory against $(basename "$other") (max +50%)" >&2
    "$root/build/attnbench" compare "$other" "$work/time.json" --metric memory --max-regress 0.5 || status=1
  fi
fi
# The run joins the history of this machine's CI runs (`attnbench history`; docs/cli.md): the
# store is ATTNBENCH_HISTORY, by default in the user's cache, which a CI keeps between runs.
history="${ATTNBENCH_HISTORY:-${XDG_CACHE_HOME:-$HOME/.cache}/attnbench/history.db}"
# Recording is a convenience: a store that cannot be written is said, never a failed gate.
if ! { mkdir -p "$(dirname "$history")" 2>/dev/null && "$root/build/attnbench" history add "$work/time.json" --db "$history"; }; then
  echo "perf_gate: this run was not recorded in $history" >&2
fi
exit $status
