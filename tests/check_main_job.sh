#!/usr/bin/env bash
# The README's main command end to end, on the reduced grid: scripts/main.sh --quick with the
# built binary into a scratch directory writes the result file, the tables, the plot and the
# crossover table, and prints the summary; run again, it keeps the first run's files (not in git)
# as NAME.previous. usage: tests/check_main_job.sh ATTNBENCH_EXE SCRATCH_DIR
set -euo pipefail
exe="$1" dir="$2"
root="$(cd "$(dirname "$0")/.." && pwd)"
rm -rf "$dir"
fail() { echo "check_main_job: $*" >&2; exit 1; }
summary=$(ATTNBENCH_EXE="$exe" "$root/scripts/main.sh" --quick --out-dir "$dir")
for f in default_sweep.json default_sweep.md default_sweep.png default_sweep.svg default_sweep_crossover.md report.html; do
  [ -s "$dir/$f" ] || fail "$f was not written"
done
grep -q "attnbench main job: done" <<<"$summary" || fail "no summary line"
grep -q "report:  $dir/report.html" <<<"$summary" || fail "the summary does not say where the report is"
grep -q "<img alt=" "$dir/report.html" || fail "the report has no plot"
grep -q "| linear" <<<"$summary" || fail "the headline table has no linear row"
"$exe" table "$dir/default_sweep.json" --metric time >/dev/null || fail "the result file does not read back"
[ "$(ls -A "$dir" | grep -c '^\.main-')" = 0 ] || fail "the scratch directory was left behind"
ATTNBENCH_EXE="$exe" "$root/scripts/main.sh" --quick --out-dir "$dir" >/dev/null
[ -s "$dir/default_sweep.json.previous" ] || fail "a second run did not keep the first run's result as .previous"
echo "check_main_job: ok"
