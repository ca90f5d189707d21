#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, runs the default benchmarks, and
# writes the result files, the markdown tables and the plots.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
exe="$root/build/attnbench"
mkdir -p "$root/results" "$root/plots"
cd "$root"

run() {  # run NAME ARGS...: results/NAME.json and results/NAME.md
  local name="$1"
  shift
  echo "== $name: attnbench run $*" >&2
  "$exe" run "$@" --out "results/$name.json" > "results/$name.md"
}

# The default sweep: every mechanism, forward, N = 256 .. 16384, one thread, error vs flash; each
# point in its own process, so a crash or an out-of-memory kill loses only that point.
rm -f results/default_sweep.json
echo "== default_sweep: attnbench sweep --attn all --seq 256:16384:x2 --mode fwd --threads 1 --error" >&2
"$exe" sweep --attn all --seq 256:16384:x2 --mode fwd --threads 1 --error --out results/default_sweep.json
{
  "$exe" table results/default_sweep.json --metric time --baseline vanilla
  echo
  "$exe" table results/default_sweep.json --metric peak_fraction --baseline none
  echo
  "$exe" table results/default_sweep.json --metric memory --baseline vanilla
  echo
  "$exe" table results/default_sweep.json --metric nmse --baseline none
} > results/default_sweep.md
/usr/bin/python3 scripts/plot.py results/default_sweep.json plots/default_sweep

# Every mechanism, forward and forward+backward, N = 256 .. 8192, one thread, error vs flash.
run attention_1thread --attn all --seq 256:8192:x2 --mode fwd,fwdbwd --threads 1 --error
# Two threads at N = 4096, for the scaling figures.
run attention_2threads --attn all --seq 4096 --mode fwd,fwdbwd --threads 2 --error
# The fixed sparse patterns against flash at N = 4096 and 16384.
run sparse --attn flash,local,sliding,dilated,strided,longformer,bigbird --seq 4096,16384 --mode fwd --threads 1
# Low-rank and compressed keys at the sizes their targets name; synthesizer's other variants.
run lowrank --attn linformer --seq 16384 --mode fwd,fwdbwd --threads 1
run memory_compressed_8192 --attn memory_compressed --seq 8192 --mode fwd,fwdbwd --threads 1
run synthesizer_variants --attn synthesizer --param variant=random --seq 1024,4096 --mode fwd,fwdbwd --threads 1 --error
run synthesizer_factorized --attn synthesizer --param variant=factorized --seq 1024,4096 --mode fwd,fwdbwd --threads 1 --error
# The kernel family at N = 16384, non-causal and causal.
run kernel_16384 --attn linear,performer --seq 16384 --mode fwd,fwdbwd --threads 1
run kernel_16384_causal --attn linear,performer --seq 16384 --mode fwd,fwdbwd --threads 1 --causal
# The routing mechanisms at the sizes their targets name.
run sinkhorn_fwdbwd --attn sinkhorn --seq 4096,16384 --mode fwdbwd --reps 3
run reformer_fwd --attn reformer,flash --seq 4096,16384 --mode fwd --reps 3 --threads 1
run reformer_fwdbwd --attn reformer --seq 4096,16384 --mode fwdbwd --reps 3 --threads 1
# Decoding one token after a context of N = 1024 .. 65536.
run decode --attn all --seq 1024:65536:x2 --mode decode --threads 1 --error

# The model level: the text model's training step on one thread (flash), and the LRA efficiency
# table (text task, N = 1K..4K, training steps, every mechanism, batch 4, two threads).
run model_text_flash_1thread --level model --task text --mode train --seq 1024 --batch 4 --attn flash --reps 5 --threads 1
run lra_efficiency --preset lra-efficiency --reps 3 --threads 2

# How fast each task generates a batch of its LRA size, one thread.
for t in copy listops text retrieval image pathfinder pathx; do
  "$exe" task rate --task "$t" --reps 3
done > results/task_rates.txt

/usr/bin/python3 scripts/plot.py results/attention_1thread.json plots/attention_1thread
/usr/bin/python3 scripts/plot.py results/decode.json plots/decode
echo "wrote results/*.json, results/*.md, plots/{default_sweep,attention_1thread,decode}.{png,svg}" >&2
