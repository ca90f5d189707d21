#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, runs the default benchmark, and
# writes the result files, the markdown tables and the plots.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
exe="$root/build/attnbench"
mkdir -p "$root/results" "$root/plots"
cd "$root"

# One thread: every mechanism, forward and forward+backward, N = 256 .. 8192, error vs flash.
"$exe" run --attn all --seq 256:8192:x2 --mode fwd,fwdbwd --threads 1 --error \
  --out results/exact_1thread.json > results/exact_1thread.md
# Two threads at N = 4096, for the scaling figure.
"$exe" run --attn all --seq 4096 --mode fwd,fwdbwd --threads 2 --error \
  --out results/exact_2threads.json > results/exact_2threads.md

/usr/bin/python3 scripts/plot.py results/exact_1thread.json plots/exact_1thread
echo "results/exact_1thread.md, results/exact_2threads.md, plots/exact_1thread.{png,svg}" >&2
