#!/usr/bin/env bash
# A private one-node Slurm cluster on this machine, for trying scripts/slurm/submit.sh and for the
# live test (tests/slurm_live.sh): munged, slurmctld and slurmd as plain background processes (no
# systemd, no cgroups), every file of theirs under one directory, ports of its own.
#
#   scripts/slurm/local-cluster.sh start DIR   start it; prints `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm/local-cluster.sh stop DIR    stop the daemons and remove DIR
#
# start wants a new DIR, as stop removes it whole; stop touches only a DIR that start made. Needs
# Debian's slurm-wlm and munge (scripts/setup.sh --tests installs them) and root, as slurmd starts
# jobs. Exits 77 when Slurm cannot be installed or started here, with the reason, so a test can
# report itself skipped.
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -eq 2 ] || { usage >&2; exit 2; }
action=$1
dir=$2
marker=".attnbench-local-cluster"

skip() { echo "local-cluster: cannot run Slurm here: $*" >&2; exit 77; }

stop() {
  [ -d "$dir" ] || return 0
  [ -f "$dir/$marker" ] || { echo "local-cluster: $dir was not made by local-cluster.sh start; not touching it" >&2; exit 2; }
  local name pid
  # Its jobs first, while the daemons that can stop them still run (a job's slurmstepd outlives
  # slurmd by design).
  if kill -0 "$(cat "$dir/slurmctld.pid" 2>/dev/null)" 2>/dev/null; then
    SLURM_CONF="$dir/slurm.conf" scancel --quiet --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 150); do
      [ -z "$(SLURM_CONF="$dir/slurm.conf" squeue -h -t running,completing 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  # The daemons' pids, read once (a daemon removes its pid file as it exits): 10 s to go after
  # SIGTERM, then SIGKILL.
  local pids=()
  for name in slurmd slurmctld munged; do
    pid=$(cat "$dir/$name.pid" 2>/dev/null || true)
    [ -n "$pid" ] && pids+=("$pid")
  done
  [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do
    local alive=0
    for pid in "${pids[@]+"${pids[@]}"}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  [ ${#pids[@]} -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
  rm -rf "$dir"
}

# A TCP port nothing listens on, from a range of its own.
free_port() {
  local p
  for p in $(seq "$1" $(($1 + 200))); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  skip "no free TCP port from $1"
}

start() {
  if [ -e "$dir" ]; then
    echo "local-cluster: $dir exists; give a new directory (stop removes it whole)" >&2
    exit 2
  fi
  for c in munged slurmctld slurmd sbatch squeue scontrol; do
    command -v "$c" >/dev/null || skip "$c is not installed (Debian: apt-get install slurm-wlm munge; scripts/setup.sh does it)"
  done
  [ "$(id -u)" = 0 ] || skip "slurmd must run as root to start jobs"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  chmod 700 "$dir"
  touch "$dir/$marker"
  mkdir -p "$dir/state" "$dir/spool"

  # munge: a key of its own, its socket in DIR (Slurm is pointed at it by AuthInfo).
  dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge.key"
  munged --force --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" 2>"$dir/munged.err" ||
    skip "munged did not start: $(tail -1 "$dir/munged.err")"

  local host ctld_port slurmd_port cpus mem_mb
  host=$(hostname -s)
  ctld_port=$(free_port 16817)
  slurmd_port=$(free_port $((ctld_port + 1)))
  cpus=$(getconf _NPROCESSORS_ONLN)
  mem_mb=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10))
  cat >"$dir/slurm.conf" <<EOF
# A one-node cluster made by scripts/slurm/local-cluster.sh; every file under $dir.
ClusterName=attnbench-local
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No systemd, no cgroups: processes tracked by their parent ids, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
# One task per CPU, so the shards of an array run side by side.
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=3600
# Quick scheduling for a small test cluster.
SchedulerParameters=sched_interval=1
MessageTimeout=20
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -i -f "$SLURM_CONF" 2>"$dir/slurmctld.err" ||
    skip "slurmctld did not start: $(tail -1 "$dir/slurmctld.err") (log: $dir/slurmctld.log)"
  slurmd -f "$SLURM_CONF" 2>"$dir/slurmd.err" ||
    skip "slurmd did not start: $(tail -1 "$dir/slurmd.err") (log: $dir/slurmd.log)"
  # Up when the node is idle (or mixed, if jobs already run).
  for _ in $(seq 300); do
    if sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.1
  done
  skip "the node did not come up within 30 s: $(sinfo -h -o '%T %E' 2>&1 | head -1); logs in $dir"
}

case "$action" in
  start) start ;;
  stop) stop ;;
  *) usage >&2; exit 2 ;;
esac
