#!/usr/bin/env bash
# Runs an attnbench grid on a Slurm cluster: one job array whose task i runs shard i/n of the grid
# into DIR/shard-i.json (with --resume, so a requeued, preempted or resubmitted task continues
# where it stopped), and one merge job, started when every task succeeded, that writes the merged
# result file.
#
#   scripts/slurm/submit.sh --shards N --dir DIR [options] -- sweep GRID...
#   scripts/slurm/submit.sh --shards N --dir DIR [options] -- train --preset NAME [...]
#   scripts/slurm/submit.sh --status DIR     per shard: points done, failed, left; the jobs' states
#   scripts/slurm/submit.sh --requeue DIR [I...]
#                     puts array tasks I (default: every stopped task whose shard has points left,
#                     e.g. after scancel or a node failure) back in the queue at once, and points the
#                     merge job at them again (Slurm never re-checks a dependency that failed)
#
# Options:
#   --shards N        the number of array tasks (the grid is split into N disjoint shards)
#   --dir DIR         the shard files, logs, job scripts and training runs; on a filesystem every
#                     node sees. New or empty, or an earlier submission of the same grid: then
#                     only the shards with points left are submitted again, with a new merge job.
#   --out FILE        the merged result file (default DIR/merged.json); must not exist yet
#   --partition P     sbatch --partition
#   --time T          sbatch --time for each task (e.g. 4:00:00)
#   --cpus C          sbatch --cpus-per-task (default 1); each point runs with --threads C unless
#                     the grid sets --threads itself
#   --exe PATH        the attnbench every node runs (default: this checkout's build/attnbench)
#   --sbatch ARG      one more sbatch argument for both jobs, e.g. --sbatch=--account=proj (repeatable)
#   --no-submit       write the job scripts and print the sbatch commands; submit nothing
#
# Bad input exits 2 with one line naming the problem, before anything is submitted.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

die() { echo "submit.sh: error: $*" >&2; exit 2; }
usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

shards="" dir="" out="" partition="" time_limit="" cpus=1 exe="" status_dir="" requeue_dir="" submit=1
extra_sbatch=()
while [ $# -gt 0 ]; do
  [ "$1" = -- ] && { shift; break; }
  [[ "$1" == --*=* ]] && set -- "${1%%=*}" "${1#*=}" "${@:2}"  # --name=value is --name value
  opt=$1
  case "$opt" in
    --no-submit) submit=0; shift; continue ;;
    -h | --help) usage; exit 0 ;;
    --shards | --dir | --out | --partition | --time | --cpus | --exe | --sbatch | --status | --requeue) ;;
    *) die "unknown option '$opt' (the grid goes after --; see --help)" ;;
  esac
  [ $# -ge 2 ] || die "$opt needs a value"
  value=$2
  shift 2
  case "$opt" in
    --shards) shards=$value ;;
    --dir) dir=$value ;;
    --out) out=$value ;;
    --partition) partition=$value ;;
    --time) time_limit=$value ;;
    --cpus) cpus=$value ;;
    --exe) exe=$value ;;
    --sbatch) extra_sbatch+=("$value") ;;
    --status) status_dir=$value ;;
    --requeue) requeue_dir=$value; break ;;  # then the task indices
  esac
done
grid=("$@")

# The files a submission keeps in DIR, read back by --status and by a resubmission.
settings_file() { echo "$1/submission.args"; }  # NUL-separated: exe, shards, out, then the grid
jobs_file() { echo "$1/jobs"; }                 # one line per submission: ARRAY_ID MERGE_ID SHARDS

read_submission() {  # sets exe shards out grid from DIR's settings
  local f
  f=$(settings_file "$1")
  [ -f "$f" ] || die "$1 holds no submission (no $(basename "$f"))"
  local fields=()
  mapfile -d '' fields <"$f"
  exe=${fields[0]} shards=${fields[1]} out=${fields[2]}
  grid=("${fields[@]:3}")
}

# attnbench's progress line of shard $2 of the submission in $1 ("shard i/n: P points, D done,
# F failed, L left (FILE)"; the numbers are the 3rd, 5th, 7th and 9th words), and its points left.
shard_line() { "$exe" "${grid[@]}" --shard "$2/$shards" --out "$1/shard-$2.json" --status; }
points_left() {
  local line lf
  line=$(shard_line "$1" "$2") || exit $?
  read -r _ _ _ _ _ _ _ _ lf _ <<<"$line"
  echo "$lf"
}

# The state of each task of array job $1 the controller still knows (finished ones too, for
# MinJobAge), into the associative array named $2, by task index.
task_states() {
  local -n into=$2
  [ -n "$1" ] && [ "$1" != - ] && command -v scontrol >/dev/null || return 0
  local line idx st
  while read -r line; do
    idx=$(grep -o 'ArrayTaskId=[0-9]*' <<<"$line" | cut -d= -f2)
    st=$(grep -o 'JobState=[A-Z_]*' <<<"$line" | cut -d= -f2)
    [ -n "$idx" ] && into[$idx]=$st
  done < <(scontrol -o show job "$1" 2>/dev/null || true)
}

# afterok on each task, not on the array: after a requeue, `scontrol update` can set it again
# (a dependency on the whole array stays failed once one task was cancelled).
task_dependency() {  # ARRAY_ID TASK...
  local a=$1 dep=afterok
  shift
  for t in "$@"; do dep+=":${a}_$t"; done
  echo "$dep"
}

# One line per shard from attnbench itself ("shard i/n: P points, D done, F failed, L left (FILE)"),
# the Slurm state of its task when the scheduler still knows the job, and the totals.
status() {
  local d=$1
  read_submission "$d"
  local array_id="" merge_id=""
  if [ -s "$(jobs_file "$d")" ]; then read -r array_id merge_id _ < <(tail -1 "$(jobs_file "$d")"); fi
  declare -A state=()
  task_states "$array_id" state
  local i line total=0 done_=0 failed=0 left=0
  for i in $(seq 1 "$shards"); do
    line=$(shard_line "$d" "$i") || exit $?
    read -r _ _ p _ dn _ fl _ lf _ <<<"$line"
    total=$((total + p)) done_=$((done_ + dn)) failed=$((failed + fl)) left=$((left + lf))
    echo "$line${state[$i]:+ [${state[$i]}]}"
  done
  local merged="merged file $out: "
  if [ -f "$out" ]; then merged+="written"; else merged+="not yet written"; fi
  if [ -n "$merge_id" ] && command -v scontrol >/dev/null; then
    local ms
    ms=$(scontrol -o show job "$merge_id" 2>/dev/null | grep -o 'JobState=[A-Z_]* Reason=[^ ]*' | sed 's/JobState=//; s/ Reason=None//; s/Reason=//' || true)
    [ -n "$ms" ] && merged+=" (merge job $merge_id: $ms)"
  fi
  echo "all: $total points, $done_ done, $failed failed, $left left; $merged"
}

# Requeues stopped tasks now (Slurm otherwise holds a requeued job for two minutes) and resets the
# merge job's dependency to the array's tasks.
requeue() {
  local d=$1
  shift
  read_submission "$d"
  local array_id="" merge_id="" spec=""
  [ -s "$(jobs_file "$d")" ] && read -r array_id merge_id spec < <(tail -1 "$(jobs_file "$d")")
  [ -n "$array_id" ] && [ "$array_id" != - ] || die "$d has no array job to requeue"
  command -v scontrol >/dev/null || die "scontrol is not on PATH"
  declare -A state=()
  task_states "$array_id" state
  local tasks=("$@") i
  for i in "${tasks[@]+"${tasks[@]}"}"; do
    [[ "$i" =~ ^[0-9]+$ ]] && [ -n "${state[$i]-}" ] || die "task $i is not a task of array job $array_id the controller knows"
  done
  if [ ${#tasks[@]} -eq 0 ]; then
    for i in "${!state[@]}"; do
      case "${state[$i]}" in PENDING | RUNNING | COMPLETING | REQUEUED | CONFIGURING | SUSPENDED) continue ;; esac
      [ "$(points_left "$d" "$i")" = 0 ] || tasks+=("$i")
    done
  fi
  if [ ${#tasks[@]} -eq 0 ]; then
    echo "submit.sh: no stopped task of array job $array_id has points left; nothing to requeue"
    return 0
  fi
  for i in "${tasks[@]}"; do
    scontrol requeue "${array_id}_$i" || die "scontrol refused to requeue ${array_id}_$i (above)"
    scontrol update jobid="${array_id}_$i" StartTime=now >/dev/null || true
  done
  local all=()
  for i in "${!state[@]}"; do all+=("$i"); done
  if [ -n "$merge_id" ] && scontrol -o show job "$merge_id" 2>/dev/null | grep -q 'JobState=PENDING'; then
    scontrol update jobid="$merge_id" dependency="$(task_dependency "$array_id" "${all[@]}")" ||
      die "scontrol refused to reset the merge job's dependency (above)"
  else
    merge_id=$(sbatch --parsable --dependency="$(task_dependency "$array_id" "${all[@]}")" "$d/merge.sbatch") ||
      die "sbatch refused the merge job (above)"
    merge_id=${merge_id%%;*}
    echo "$array_id $merge_id $spec" >>"$(jobs_file "$d")"
  fi
  echo "submit.sh: requeued task(s) ${tasks[*]} of array job $array_id; merge job $merge_id waits for them"
}

if [ -n "$status_dir" ]; then
  [ -d "$status_dir" ] || die "--status $status_dir: no such directory"
  status "$status_dir"
  exit 0
fi
if [ -n "$requeue_dir" ]; then
  [ -d "$requeue_dir" ] || die "--requeue $requeue_dir: no such directory"
  requeue "$requeue_dir" "$@"
  exit 0
fi

# --- validate ---
# Every value ends up in a job script: a control character (a newline above all) would start a
# line of its own there, which bash runs. The #SBATCH values are also read by sbatch, which splits
# them at white space and quotes, so they are single words of the characters Slurm's names use.
printable() {  # OPTION VALUE
  [[ "$2" != *[[:cntrl:]]* ]] || die "$1 holds a control character (a newline, tab, ...); refused"
}
printable --shards "$shards"; printable --dir "$dir"; printable --out "$out"; printable --exe "$exe"
printable --partition "$partition"; printable --time "$time_limit"; printable --cpus "$cpus"
for a in "${grid[@]+"${grid[@]}"}"; do printable "the grid argument '${a%%[[:cntrl:]]*}...'" "$a"; done
sbatch_word='^[A-Za-z0-9_.,:=/@%+-]+$'
[ -z "$partition" ] || [[ "$partition" =~ ^[A-Za-z0-9_.,-]+$ ]] ||
  die "--partition '$partition' is not a partition name (letters, digits, _ . , -)"
[ -z "$time_limit" ] || [[ "$time_limit" =~ ^([0-9]+(-[0-9]+)?(:[0-9]+){0,2}|UNLIMITED|INFINITE)$ ]] ||
  die "--time '$time_limit' is not a Slurm time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S)"
for a in "${extra_sbatch[@]+"${extra_sbatch[@]}"}"; do
  printable --sbatch "$a"
  [[ "$a" == -* && "$a" =~ $sbatch_word ]] ||
    die "--sbatch '$a' is not one sbatch option word (e.g. --account=proj; no spaces, quotes or shell characters)"
done
[ -n "$shards" ] || die "--shards N is required"
[[ "$shards" =~ ^[1-9][0-9]*$ ]] && [ "$shards" -le 10000 ] || die "--shards $shards is not a count from 1 to 10000"
[[ "$cpus" =~ ^[1-9][0-9]*$ ]] || die "--cpus $cpus is not a positive count"
[ -n "$dir" ] || die "--dir DIR is required (where the shard files go, on a filesystem every node sees)"
[ ${#grid[@]} -gt 0 ] || die "no grid: give it after --, e.g. -- sweep --attn all --seq 256:4096:x2"
case "${grid[0]}" in
  sweep) ;;
  train) printf '%s\n' "${grid[@]}" | grep -qx -- '--preset\|--preset=.*' ||
           die "train runs on a cluster as a --preset grid (or use: sweep --verb train ...)" ;;
  *) die "the grid must start with 'sweep' or 'train', not '${grid[0]}'" ;;
esac
has_threads=0
for a in "${grid[@]}"; do
  case "$a" in
    --out | --out=* | --shard | --shard=* | --resume | --train-dir | --train-dir=* | --dry-run | --status)
      die "the grid may not set $a: submit.sh sets it for each shard" ;;
    --threads | --threads=*) has_threads=1 ;;
  esac
done
[ $has_threads = 1 ] || grid+=(--threads "$cpus")
if [ -z "$exe" ]; then
  exe="$root/build/attnbench"
  [ -x "$exe" ] || exe=$(command -v attnbench || true)
  [ -n "$exe" ] && [ -x "$exe" ] || die "no attnbench to run: build it (scripts/build.sh) or give --exe"
fi
[ -x "$exe" ] || die "--exe $exe is not an executable"
exe=$(cd "$(dirname "$exe")" && pwd)/$(basename "$exe")
[[ "$dir" =~ [[:space:]\"\'\\] ]] && die "--dir '$dir' holds white space, a quote or a backslash, which Slurm's #SBATCH --output cannot take"
dir=$(realpath -m -- "$dir")
[ ! -e "$dir" ] || [ -d "$dir" ] || die "--dir $dir exists and is not a directory"
[ -n "$out" ] || out="$dir/merged.json"
case "$out" in /*) ;; *) out="$(pwd)/$out" ;; esac
[ -e "$out" ] && die "$out exists; give another --out (the merge job never overwrites a file)"

# The grid checked by attnbench itself (a bad option exits 2 here, not in N tasks on the cluster).
"$exe" "${grid[@]}" --shard "1/$shards" --out "$dir/shard-1.json" --dry-run >/dev/null ||
  die "attnbench refused the grid (above); nothing submitted"

# A new submission, or the same one again (then only the shards with points left).
settings=$(printf '%s\0' "$exe" "$shards" "$out" "${grid[@]}" | od -An -c | tr -d ' \n')
resubmit=0
if [ -f "$(settings_file "$dir")" ]; then
  previous=$(od -An -c <"$(settings_file "$dir")" | tr -d ' \n')
  [ "$previous" = "$settings" ] || die "$dir holds another submission (its grid, shard count, binary or --out differ); give a new --dir"
  resubmit=1
elif [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
  die "$dir is not empty and holds no submission; give a new or empty --dir"
fi
mkdir -p "$dir" 2>/dev/null || die "--dir $dir cannot be made"

tasks=()
if [ $resubmit = 1 ]; then
  # Not while tasks of the last submission may still run: two writers of a shard file are refused.
  if [ -s "$(jobs_file "$dir")" ]; then
    read -r last_array _ < <(tail -1 "$(jobs_file "$dir")")
    declare -A last_state=()
    task_states "$last_array" last_state
    for i in "${!last_state[@]}"; do
      case "${last_state[$i]}" in
        PENDING | RUNNING | COMPLETING | REQUEUED | CONFIGURING | SUSPENDED)
          die "task $i of array job $last_array is ${last_state[$i]}; wait for it, or --requeue $dir for stopped tasks" ;;
      esac
    done
  fi
  for i in $(seq 1 "$shards"); do
    [ "$(points_left "$dir" "$i")" = 0 ] || tasks+=("$i")
  done
  if [ ${#tasks[@]} -eq 0 ]; then
    echo "submit.sh: every shard in $dir is complete; submitting the merge job only" >&2
  fi
else
  tasks=($(seq 1 "$shards"))
fi
array_spec=$(IFS=,; echo "${tasks[*]}")
[ ${#tasks[@]} -eq "$shards" ] && array_spec="1-$shards"

mkdir -p "$dir/logs"
printf '%s\0' "$exe" "$shards" "$out" "${grid[@]}" >"$dir/.submission.args.tmp"
mv "$dir/.submission.args.tmp" "$(settings_file "$dir")"

# --- the job scripts (shown in full in docs/cluster.md) ---
q() {  # a word for the job script: as is when plain, else in single quotes
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,+@%^-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
quoted_grid=""
for a in "${grid[@]}"; do quoted_grid+=" $(q "$a")"; done
sbatch_lines=""
[ -n "$partition" ] && sbatch_lines+="#SBATCH --partition=$partition"$'\n'
[ -n "$time_limit" ] && sbatch_lines+="#SBATCH --time=$time_limit"$'\n'
for a in "${extra_sbatch[@]+"${extra_sbatch[@]}"}"; do sbatch_lines+="#SBATCH $a"$'\n'; done

cat >"$dir/shard.sbatch" <<EOF
#!/bin/bash
# Shard \$SLURM_ARRAY_TASK_ID of $shards of an attnbench grid; made by scripts/slurm/submit.sh.
# Each task resumes its own shard file, so a requeued, preempted or resubmitted task continues
# where it stopped (scancel and time limits send SIGTERM, which the sweep obeys, keeping its points).
#SBATCH --job-name=attnbench-shards
#SBATCH --array=1-$shards
#SBATCH --cpus-per-task=$cpus
#SBATCH --output=$dir/logs/shard-%a.log
#SBATCH --open-mode=append
#SBATCH --requeue
${sbatch_lines}set -euo pipefail
shard=\${SLURM_ARRAY_TASK_ID:?submit this script with sbatch --array}
exec $(q "$exe")$quoted_grid --shard "\$shard/$shards" --resume --out $(q "$dir")/shard-\$shard.json --train-dir $(q "$dir/train")
EOF

shard_files=""
for i in $(seq 1 "$shards"); do shard_files+=" $(q "$dir/shard-$i.json")"; done
cat >"$dir/merge.sbatch" <<EOF
#!/bin/bash
# Merges the $shards shard files of an attnbench grid into one; made by scripts/slurm/submit.sh and
# submitted with --dependency=afterok on each task of the shards' array job.
#SBATCH --job-name=attnbench-merge
#SBATCH --cpus-per-task=1
#SBATCH --output=$dir/logs/merge.log
#SBATCH --open-mode=append
${sbatch_lines}set -euo pipefail
exec $(q "$exe") merge$shard_files --out $(q "$out")
EOF
bash -n "$dir/shard.sbatch" && bash -n "$dir/merge.sbatch"

if [ ${#tasks[@]} -gt 0 ]; then
  array_cmd=(sbatch --parsable --array="$array_spec" "$dir/shard.sbatch")
else
  array_cmd=()
fi
if [ $submit = 0 ]; then
  echo "submit.sh: wrote $dir/shard.sbatch and $dir/merge.sbatch; to submit:"
  dependency=""
  if [ ${#array_cmd[@]} -gt 0 ]; then
    echo "  array=\$(${array_cmd[*]})"
    dependency="--dependency=afterok:\${array}_${tasks[0]}"
    [ ${#tasks[@]} -gt 1 ] && dependency+=":...:\${array}_${tasks[-1]}"
    dependency+=" "
  fi
  echo "  sbatch --parsable $dependency$dir/merge.sbatch"
  exit 0
fi
command -v sbatch >/dev/null || die "sbatch is not on PATH (no Slurm here); --no-submit writes the scripts only"
array_id="-"
if [ ${#array_cmd[@]} -gt 0 ]; then
  array_id=$("${array_cmd[@]}") || die "sbatch refused the array job (above)"
  array_id=${array_id%%;*}
  merge_id=$(sbatch --parsable --dependency="$(task_dependency "$array_id" "${tasks[@]}")" "$dir/merge.sbatch") ||
    die "sbatch refused the merge job (above); the array job $array_id was submitted"
else
  merge_id=$(sbatch --parsable "$dir/merge.sbatch") || die "sbatch refused the merge job (above)"
fi
merge_id=${merge_id%%;*}
echo "$array_id $merge_id $array_spec" >>"$(jobs_file "$dir")"
echo "submit.sh: array job $array_id (shards $array_spec of $shards), merge job $merge_id -> $out"
echo "  progress: scripts/slurm/submit.sh --status $dir"
