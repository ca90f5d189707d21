#!/usr/bin/env bash
# The README's main command: installs what is missing, builds the attnbench binary (only it: no
# tests, no micro-benchmarks), runs the default sweep (every mechanism, forward, N = 256 .. 16384,
# one thread, the error against flash; each point in its own process), and writes its result
# file, tables, plot and HTML report; at the end, a summary: the headline table and where the files are.
# About 9 minutes on the 2-core reference machine, build included (docs/measurements/).
#
# usage: scripts/main.sh [--quick] [--out-dir DIR]
#   --quick        a reduced grid (three mechanisms, N = 256, 512) for a smoke test (tests/ runs it)
#   --out-dir DIR  where the results go (default results/main; the plot goes to DIR too unless
#                  it is results/main, whose plot is plots/main/)
#   ATTNBENCH_EXE=PATH uses that binary instead of building one.
#
# A file it replaces is never lost: one committed in git and unmodified is replaced (git restores
# it, and the summary says so); any other is first renamed to NAME.previous.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
quick=0
out_dir="results/main"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --out-dir) out_dir="$2"; shift ;;
    *) echo "main.sh: unknown option '$1' (options: --quick, --out-dir DIR)" >&2; exit 2 ;;
  esac
  shift
done
plot_dir="$out_dir"
[ "$out_dir" = "results/main" ] && plot_dir="plots/main"
start=$(date +%s)

if [ -n "${ATTNBENCH_EXE:-}" ]; then
  exe="$ATTNBENCH_EXE"
else
  "$root/scripts/setup.sh"
  echo "== build: attnbench" >&2
  cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$root/build" -j "$(nproc)" --target attnbench
  exe="$root/build/attnbench"
fi

if [ "$quick" = 1 ]; then
  grid=(--attn flash,linear,local --seq 256,512 --batch 1 --heads 2 --dhead 16 --reps 3 --min-time 0)
else
  grid=(--attn all --seq 256:16384:x2)
fi
grid+=(--mode fwd --threads 1 --error)

# Everything is written to a new directory first and moved into place at the end, so a stopped
# job leaves the previous results whole.
mkdir -p "$out_dir" "$plot_dir"
work="$(mktemp -d "$out_dir/.main-XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "== default sweep: attnbench sweep ${grid[*]}" >&2
"$exe" sweep "${grid[@]}" --out "$work/default_sweep.json"
{
  echo "# The default sweep"
  echo
  echo "\`attnbench sweep ${grid[*]}\`; each cell is the median time in ms and, in brackets, how many times"
  echo "faster than the baseline (flash); then the fraction of the GEMM rate, the tracked memory and the error."
  echo
  "$exe" table "$work/default_sweep.json" --metric time --baseline flash
  echo
  "$exe" table "$work/default_sweep.json" --metric peak_fraction --baseline none
  echo
  "$exe" table "$work/default_sweep.json" --metric memory --baseline flash
  echo
  "$exe" table "$work/default_sweep.json" --metric nmse --baseline none
} > "$work/default_sweep.md"
/usr/bin/python3 scripts/plot.py "$work/default_sweep.json" "$work/default_sweep" --baseline flash --attnbench "$exe"
# The report: one HTML page with the tables, the plot and every point's command.
"$exe" report "$work/default_sweep.json" --out "$work/report" --title "attnbench: the default sweep" >/dev/null
sed -i "s#$work/default_sweep.json#$out_dir/default_sweep.json#g" "$work/report/index.html"
# The crossover table names its source file: the one it will be, not the scratch copy.
sed -i "s#$work/default_sweep.json#$out_dir/default_sweep.json#" "$work/default_sweep_crossover.md"

# Into place (scripts/place.sh: nothing it replaces is lost).
source "$root/scripts/place.sh"
place "$work/default_sweep.json" "$out_dir/default_sweep.json"
place "$work/default_sweep.md" "$out_dir/default_sweep.md"
for ext in png svg; do place "$work/default_sweep.$ext" "$plot_dir/default_sweep.$ext"; done
place "$work/default_sweep_crossover.md" "$out_dir/default_sweep_crossover.md"
place "$work/report/index.html" "$out_dir/report.html"

# The summary: the headline table (time, against flash, at the longest lengths) and the files.
elapsed=$(( $(date +%s) - start ))
echo
echo "== attnbench main job: done in $((elapsed / 60))m$((elapsed % 60))s"
echo
longest=$("$exe" export "$out_dir/default_sweep.json" --format jsonl | /usr/bin/python3 -c '
import json, sys
ns = sorted({json.loads(l)["point.seq"] for l in sys.stdin})
print("|".join(f"N:{n}/" for n in ns[-2:]))')
"$exe" table "$out_dir/default_sweep.json" --metric time --baseline flash --filter "$longest"
echo
echo "results: $out_dir/default_sweep.json (the result file), $out_dir/default_sweep.md (tables),"
echo "         $out_dir/default_sweep_crossover.md (where each mechanism overtakes flash)"
echo "plot:    $plot_dir/default_sweep.png (and .svg)"
echo "report:  $out_dir/report.html (open it in a browser: tables, plot, every point's command; no network)"
if [ ${#replaced[@]} -gt 0 ]; then
  echo "replaced the committed ${replaced[*]}: \`git diff --stat\` shows the change, \`git checkout -- FILE\` restores one"
fi
echo "more:    scripts/reproduce.sh --list (the published tables and the longer studies)"
