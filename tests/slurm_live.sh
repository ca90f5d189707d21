#!/usr/bin/env bash
# The cluster path against a live Slurm: a private one-node cluster (scripts/slurm/local-cluster.sh)
# runs grids submitted by scripts/slurm/submit.sh.
#   1. a 12-point attention sweep as 3 shards: the merged file holds exactly the unsharded grid's
#      points, once each;
#   2. the same with one array task cancelled mid-run (scancel) and requeued (submit.sh --requeue):
#      no point missing or duplicated, the stopped shard resumed, not restarted;
#   3. two training runs as an array of 2, merged;
# and prints what Slurm adds: submission to start per task, the merge job's time, and the
# end-to-end time against the unsharded run. The daemons are stopped and their state removed
# whatever happens. Exit 77 (skipped) when Slurm cannot be installed or started here.
# usage: tests/slurm_live.sh ATTNBENCH_EXE
set -euo pipefail
exe=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
submit="$root/scripts/slurm/submit.sh"
py=/usr/bin/python3

work=$(mktemp -d -t attnbench-slurm-test.XXXXXX)
cluster="$work/cluster"
cleanup() {
  "$root/scripts/slurm/local-cluster.sh" stop "$cluster" || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rc=0
env_line=$("$root/scripts/slurm/local-cluster.sh" start "$cluster" 2>"$work/start.err") || rc=$?
if [ $rc = 77 ]; then
  echo "SKIPPED: $(tail -1 "$work/start.err"); scripts/test.sh installs slurm-wlm and munge"
  exit 77
fi
[ $rc = 0 ] || { echo "FAIL: local-cluster.sh start exited $rc: $(tail -1 "$work/start.err")"; exit 1; }
eval "$env_line"  # SLURM_CONF

fail() {
  echo "FAIL: $*"
  for f in "$cluster"/slurmctld.log "$cluster"/slurmd.log; do
    echo "--- last lines of $f"
    tail -5 "$f" 2>/dev/null || true
  done
  exit 1
}
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Waits up to $2 seconds for file $1.
wait_for_file() {
  local i
  for i in $(seq $(($2 * 10))); do
    [ -f "$1" ] && return 0
    sleep 0.1
  done
  "$submit" --status "$(dirname "$1")" || true
  squeue -r || true
  fail "$1 did not appear within $2 s"
}

# The names of the points in a result file, one line each, sorted, a point once however many
# repetitions it has; and the count of iteration entries per point must equal REPS ($2).
point_names() {
  "$py" - "$1" "$2" <<'EOF'
import collections, json, sys
doc = json.load(open(sys.argv[1]))
reps = int(sys.argv[2])
count = collections.Counter(b["name"] for b in doc["benchmarks"] if b.get("run_type") == "iteration")
for name, n in sorted(count.items()):
    if n != reps:
        sys.exit(f"{name}: {n} repetitions in {sys.argv[1]}, expected {reps} (a point run twice or half-kept)")
    print(name)
EOF
}

grid=(sweep --attn flash,linear,local --seq 256,512,1024,2048 --heads 2 --dhead 16 --reps 3 --min-time 0.05)

# --- unsharded, for the expected points and the time to beat ---
t0=$(now)
"$exe" "${grid[@]}" --threads 1 --out "$work/whole.json" 2>"$work/whole.log" || fail "the unsharded sweep failed"
t_whole=$(secs "$t0" "$(now)")
point_names "$work/whole.json" 3 >"$work/whole.names" || fail "the unsharded file"
[ "$(wc -l <"$work/whole.names")" = 12 ] || fail "the unsharded grid has $(wc -l <"$work/whole.names") points, not 12"

# --- 1. three shards and a merge job ---
t0=$(now)
"$submit" --shards 3 --dir "$work/sharded" -- "${grid[@]}" >"$work/submit1.log" || fail "submit: $(cat "$work/submit1.log")"
wait_for_file "$work/sharded/merged.json" 300
t_sharded=$(secs "$t0" "$(now)")
# the merge job's file is written before its job ends: wait for the controller to see it end
read -r array1 merge1 _ <"$work/sharded/jobs"
for _ in $(seq 100); do scontrol -o show job "$merge1" | grep -q 'JobState=COMPLETED' && break; sleep 0.1; done
point_names "$work/sharded/merged.json" 3 >"$work/sharded.names" || fail "the merged file"
diff "$work/whole.names" "$work/sharded.names" >/dev/null ||
  fail "the merged points differ from the unsharded grid's: $(diff "$work/whole.names" "$work/sharded.names" | head -3)"
grep -q 'shard-%a.log' "$work/sharded/shard.sbatch" && grep -q '"$shard/3"' "$work/sharded/shard.sbatch" ||
  fail "the job script does not name 3 shards"
echo "PASS sharded: 3 shards merged into the unsharded grid's 12 points, once each"

# What Slurm adds: an empty job's submission-to-start (its own clock, not scontrol's 1 s
# resolution), and from the last shard file's last write to the merged file (the dependency
# release, the merge job's start and attnbench merge).
latency=""
for k in 1 2 3; do
  t0=$(now)
  sbatch --quiet --wrap "date +%s.%N > $work/noop$k" -o /dev/null
  wait_for_file "$work/noop$k" 60
  for _ in $(seq 50); do [ -s "$work/noop$k" ] && break; sleep 0.02; done
  latency+=" $(secs "$t0" "$(cat "$work/noop$k")")"
done
last_shard=$(for i in 1 2 3; do date -r "$work/sharded/shard-$i.json" +%s.%N; done | sort -n | tail -1)
merge_after=$(secs "$last_shard" "$(date -r "$work/sharded/merged.json" +%s.%N)")
echo "TIMES 12 points: unsharded ${t_whole} s; 3 shards on $(getconf _NPROCESSORS_ONLN) CPUs, submission to merged file" \
  "${t_sharded} s; an empty job's submission to start:${latency} s; last shard written to merged file ${merge_after} s"

# --- 2. one task cancelled mid-run, then requeued ---
"$submit" --shards 3 --dir "$work/cancelled" -- "${grid[@]}" >"$work/submit2.log" || fail "submit: $(cat "$work/submit2.log")"
read -r array2 merge2 _ <"$work/cancelled/jobs"
# Cancel task 1 once it has finished a point and while it has points left.
cancelled_with=""
for _ in $(seq 600); do
  line=$("$exe" "${grid[@]}" --threads 1 --shard 1/3 --out "$work/cancelled/shard-1.json" --status)
  read -r _ _ _ _ done1 _ _ _ left1 _ <<<"$line"
  if [ "${done1:-0}" -ge 1 ] && [ "${left1:-0}" -ge 1 ]; then
    scancel "${array2}_1"
    cancelled_with=$done1
    break
  fi
  sleep 0.05
done
[ -n "$cancelled_with" ] || fail "task 1 never ran a point with points left to cancel"
for _ in $(seq 300); do
  scontrol -o show job "${array2}_1" | grep -q 'JobState=CANCELLED' && break
  sleep 0.1
done
scontrol -o show job "${array2}_1" | grep -q 'JobState=CANCELLED' || fail "task 1 did not stop on scancel"
line=$("$exe" "${grid[@]}" --threads 1 --shard 1/3 --out "$work/cancelled/shard-1.json" --status)
read -r _ _ _ _ kept _ failed1 _ left1 _ <<<"$line"
[ "$failed1" = 0 ] || fail "the cancelled point was recorded as failed: $line"
[ "$left1" -ge 1 ] || fail "task 1 finished before the cancel reached it: $line"
"$submit" --requeue "$work/cancelled" >"$work/requeue.log" || fail "requeue: $(cat "$work/requeue.log")"
wait_for_file "$work/cancelled/merged.json" 300
point_names "$work/cancelled/merged.json" 3 >"$work/cancelled.names" || fail "the merged file after the requeue"
diff "$work/whole.names" "$work/cancelled.names" >/dev/null ||
  fail "after cancel and requeue the points differ: $(diff "$work/whole.names" "$work/cancelled.names" | head -3)"
grep -q "$kept already in" "$work/cancelled/logs/shard-1.log" || fail "the requeued task did not resume its shard file"
echo "PASS cancel: task 1 cancelled with $kept of 4 points kept, requeued, resumed; 12 points once each"

# --- 3. two training runs as an array ---
train=(sweep --verb train --attn flash,linear --task copy --seq 32 --layers 1 --dmodel 16 --heads 2 --mlp 32
       --batch 8 --steps 20 --eval-examples 16 --test-examples 16)
"$submit" --shards 2 --dir "$work/train" -- "${train[@]}" >"$work/submit3.log" || fail "submit: $(cat "$work/submit3.log")"
wait_for_file "$work/train/merged.json" 300
"$py" - "$work/train/merged.json" <<'EOF' || fail "the merged training file"
import json, sys
runs = [b for b in json.load(open(sys.argv[1]))["benchmarks"] if b.get("run_type") == "iteration"]
mechs = sorted(b["name"].split("/")[0] for b in runs)
assert mechs == ["attn:flash", "attn:linear"], mechs
assert all("accuracy" in b for b in runs), "a run without its test accuracy"
EOF
ls "$work/train/train/checkpoints" | grep -q flash || fail "no checkpoint of the flash run under DIR/train"
echo "PASS train: 2 training runs as an array of 2, merged, checkpoints under the submission's directory"
