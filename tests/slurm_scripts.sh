#!/usr/bin/env bash
# scripts/slurm/submit.sh without a cluster (--no-submit): the job scripts it writes pass bash -n
# and name the shard count asked for; bad input exits 2 with one line and submits nothing; an
# earlier submission's directory is only reused for the same grid.
# usage: tests/slurm_scripts.sh ATTNBENCH_EXE
set -euo pipefail
exe=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
submit="$root/scripts/slurm/submit.sh"
work=$(mktemp -d -t attnbench-slurm-scripts.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

grid=(sweep --attn flash,linear --seq 64,128 --heads 1 --dhead 8 --filter 'attn:(flash|linear)/')
for n in 1 5 7; do
  d="$work/n$n"
  "$submit" --shards $n --dir "$d" --exe "$exe" --cpus 2 --partition short --time 0:30:00 \
    --sbatch=--account=proj --no-submit -- "${grid[@]}" >"$work/out" || fail "--no-submit with $n shards: $(cat "$work/out")"
  for f in shard.sbatch merge.sbatch; do bash -n "$d/$f" || fail "$f for $n shards does not parse"; done
  grep -qx "#SBATCH --array=1-$n" "$d/shard.sbatch" || fail "shard.sbatch does not ask for $n tasks"
  grep -q -- "--shard \"\$shard/$n\" --resume" "$d/shard.sbatch" || fail "shard.sbatch does not run shard i/$n with --resume"
  grep -qx "#SBATCH --cpus-per-task=2" "$d/shard.sbatch" || fail "no --cpus-per-task=2"
  grep -q -- "--threads 2 " "$d/shard.sbatch" || fail "the points do not run with the task's 2 CPUs"
  grep -qx "#SBATCH --partition=short" "$d/merge.sbatch" || fail "no partition in merge.sbatch"
  grep -qx "#SBATCH --account=proj" "$d/shard.sbatch" || fail "the extra sbatch argument is missing"
  grep -q "'attn:(flash|linear)/'" "$d/shard.sbatch" || fail "the filter is not quoted for the shell"
  [ "$(grep -o 'shard-[0-9]*\.json' "$d/merge.sbatch" | sort -u | wc -l)" = $n ] || fail "merge.sbatch does not merge $n files"
  # The job's command, run by hand as task 1, is the grid's shard 1 (the quoting survives).
  cmd=$(grep '^exec ' "$d/shard.sbatch" | sed 's/^exec //')
  SLURM_ARRAY_TASK_ID=1 bash -c "set -- ; shard=1; eval \"\$0\" --dry-run >/dev/null" "$cmd" ||
    fail "the job's command line is refused by attnbench: $cmd"
done
echo "PASS job scripts for 1, 5 and 7 shards"

# Bad input: exit 2, one line, nothing submitted or written.
expect2() {
  local says=$1
  shift
  local rc=0
  "$@" >"$work/bad.out" 2>&1 || rc=$?
  [ $rc = 2 ] || fail "exit $rc, not 2, for: $* ($(cat "$work/bad.out"))"
  grep -q -- "$says" "$work/bad.out" || fail "'$says' not in: $(cat "$work/bad.out")"
  [ "$(wc -l <"$work/bad.out")" -le 2 ] || fail "more than one error line: $(cat "$work/bad.out")"
}
expect2 "--shards N is required" "$submit" --dir "$work/b1" --no-submit -- "${grid[@]}"
expect2 "is not a count" "$submit" --shards 0 --dir "$work/b1" --no-submit -- "${grid[@]}"
expect2 "may not set --out" "$submit" --shards 2 --dir "$work/b1" --no-submit -- "${grid[@]}" --out x.json
expect2 "may not set --shard" "$submit" --shards 2 --dir "$work/b1" --no-submit -- "${grid[@]}" --shard 1/2
expect2 "must start with" "$submit" --shards 2 --dir "$work/b1" --no-submit -- run --attn flash
expect2 "as a --preset grid" "$submit" --shards 2 --dir "$work/b1" --no-submit -- train --attn flash
expect2 "attnbench refused the grid" "$submit" --shards 2 --dir "$work/b1" --exe "$exe" --no-submit -- sweep --attn nosuch
expect2 "unknown option" "$submit" --shards 2 --bogus --dir "$work/b1" -- "${grid[@]}"
mkdir -p "$work/users"
echo "keep me" >"$work/users/notes.txt"
expect2 "not empty" "$submit" --shards 2 --dir "$work/users" --exe "$exe" --no-submit -- "${grid[@]}"
[ "$(cat "$work/users/notes.txt")" = "keep me" ] && [ "$(ls "$work/users")" = notes.txt ] || fail "the user's directory was touched"
echo '{}' >"$work/taken.json"
expect2 "exists" "$submit" --shards 2 --dir "$work/b2" --exe "$exe" --out "$work/taken.json" --no-submit -- "${grid[@]}"
# The same directory again: the same grid is a resubmission, another grid is refused.
"$submit" --shards 5 --dir "$work/n5" --exe "$exe" --cpus 2 --partition short --time 0:30:00 \
  --sbatch=--account=proj --no-submit -- "${grid[@]}" >/dev/null || fail "resubmitting the same grid was refused"
expect2 "holds another submission" "$submit" --shards 4 --dir "$work/n5" --exe "$exe" --no-submit -- "${grid[@]}"
[ -e "$work/b1" ] && fail "a refused submission made its directory"
# The local cluster starts only in a new directory and stops (removing it) only the one it made.
cluster="$root/scripts/slurm/local-cluster.sh"
expect2 "exists" "$cluster" start "$work/users"
expect2 "not made by local-cluster.sh" "$cluster" stop "$work/users"
mkdir -p "$work/empty"
expect2 "exists" "$cluster" start "$work/empty"
[ -d "$work/empty" ] && [ "$(cat "$work/users/notes.txt")" = "keep me" ] || fail "local-cluster.sh touched a user's directory"
echo "PASS bad input exits 2 with one line, the user's files untouched"

# --status needs no cluster: it reads the shard files.
"$exe" "${grid[@]}" --threads 2 --reps 1 --min-time 0 --shard 2/5 --out "$work/n5/shard-2.json" >/dev/null 2>&1 ||
  fail "running shard 2 by hand"
"$submit" --status "$work/n5" >"$work/status" || fail "--status: $(cat "$work/status")"
grep -q "^shard 2/5: 1 points, 1 done, 0 failed, 0 left" "$work/status" || fail "shard 2 in: $(cat "$work/status")"
grep -q "^all: 4 points, 1 done, 0 failed, 3 left" "$work/status" || fail "the totals in: $(cat "$work/status")"
echo "PASS --status from the shard files"

# Hostile values of every option (issue 55): a newline once made a --partition value a line of
# its own in the job scripts, which bash ran. A value is refused (exit 2) or written so that the
# scripts, run by hand as Slurm would, execute nothing but attnbench.
marker="$work/INJECTED"  # the values say `touch INJECTED`, run from $work
small=(sweep --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0)
hostile=($'p\ntouch INJECTED' "p;touch INJECTED" "\$(touch INJECTED)" "\`touch INJECTED\`" "p' ; touch INJECTED; '" \
         "p\" ; touch INJECTED; \"" $'p\rx' $'p\tx' "p x")
k=0
for opt in --shards --dir --out --partition --time --cpus --exe --sbatch grid; do
  for v in "${hostile[@]}"; do
    k=$((k + 1))
    d="$work/h$k"
    args=(--shards 1 --dir "$d" --exe "$exe" --no-submit)
    case "$opt" in
      --dir) args=(--shards 1 --dir "$work/$v" --exe "$exe" --no-submit) ;;
      --out) args+=(--out "$work/$v.json") ;;
      --exe) args=(--shards 1 --dir "$d" --exe "$v" --no-submit) ;;
      --shards | --cpus) args+=("$opt" "$v") ;;
      --partition | --time | --sbatch) args+=("$opt" "--$v") ;;
    esac
    grid_args=("${small[@]}")
    [ "$opt" = grid ] && grid_args+=(--context "note=$v")
    rc=0
    (cd "$work" && "$submit" "${args[@]}" -- "${grid_args[@]}") >"$work/h.out" 2>&1 || rc=$?
    if [ $rc = 0 ]; then
      # Accepted: the scripts run as Slurm runs them (task 1, then the merge) and do only their job.
      dd=$(sed -n 's/^submit.sh: wrote \(.*\)\/shard.sbatch and .*/\1/p' "$work/h.out")
      [ -f "$dd/shard.sbatch" ] || fail "$opt '$v' accepted but no scripts: $(cat "$work/h.out")"
      (cd "$work" && SLURM_ARRAY_TASK_ID=1 bash "$dd/shard.sbatch") >/dev/null 2>&1 || fail "$opt '$v': shard.sbatch failed"
      (cd "$work" && bash "$dd/merge.sbatch") >/dev/null 2>&1 || fail "$opt '$v': merge.sbatch failed"
      ! grep -q '^ *touch' "$dd/shard.sbatch" "$dd/merge.sbatch" || fail "$opt '$v': a line of its own in a job script"
    elif [ $rc != 2 ]; then
      fail "$opt '$v': exit $rc, not 0 or 2: $(cat "$work/h.out")"
    fi
    [ ! -e "$marker" ] || fail "$opt '$v' ran a command of its own (exit $rc)"
  done
done
echo "PASS hostile values of every option are refused or quoted ($k cases)"
