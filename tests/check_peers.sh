#!/usr/bin/env bash
# scripts/peers.py on a tiny grid: its file reads back through `attnbench table` (the peer rows
# beside the suite's), carries the suite's FLOPs for the same point, names the BLAS in its
# context, and merges with the suite's own file of the same machine. Refuses an existing --out.
# Skipped (77) without PyTorch (Debian's python3-torch, an optional dependency).
# usage: tests/check_peers.sh ATTNBENCH_EXE
set -euo pipefail
exe=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=/usr/bin/python3
"$py" -c "import torch" 2>/dev/null || { echo "SKIPPED: PyTorch is not installed (apt-get install python3-torch)"; exit 77; }
work=$(mktemp -d -t attnbench-peers.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

grid=(--seq 32,64 --heads 2 --dhead 16 --mode fwd,fwdbwd)
"$py" "$root/scripts/peers.py" --attnbench "$exe" "${grid[@]}" --causal 0,1 --reps 2 --min-time 0 \
  --out "$work/peers.json" 2>"$work/peers.log" || fail "peers.py: $(tail -3 "$work/peers.log")"
"$exe" table "$work/peers.json" >"$work/table.md" 2>&1 || fail "table cannot read the peer file: $(cat "$work/table.md")"
[ "$(grep -c '^| torch-naive allocator=default ' "$work/table.md")" = 4 ] || fail "no default-allocator rows in: $(cat "$work/table.md")"
[ "$(grep -c '^| torch-naive allocator=tuned ' "$work/table.md")" = 4 ] || fail "no tuned-allocator rows in: $(cat "$work/table.md")"

# The suite's own points of the same grid: the same FLOPs, one table, one merged file.
"$exe" sweep --attn vanilla "${grid[@]}" --causal --reps 1 --min-time 0 --out "$work/suite_causal.json" 2>/dev/null
"$exe" sweep --attn vanilla "${grid[@]}" --reps 1 --min-time 0 --out "$work/suite.json" 2>/dev/null
"$py" - "$work/peers.json" "$work/suite.json" "$work/suite_causal.json" <<'PY' || fail "FLOPs or context"
import json, sys
peers = json.load(open(sys.argv[1]))
suite = [b for f in sys.argv[2:] for b in json.load(open(f))["benchmarks"] if b.get("run_type") == "iteration"]
flops = {b["name"].replace("attn:vanilla/", ""): b["flops"] for b in suite}
ctx = peers["context"]
assert "blas_library" in ctx and "torch_version" in ctx and ctx["allocators"], ctx
seen = 0
for b in peers["benchmarks"]:
    key = b["name"].split("/", 2)[2].removesuffix("_median")
    assert b["flops"] == flops[key], (b["name"], b["flops"], flops[key])
    if b.get("run_type") == "iteration":
        assert b["real_time"] > 0 and b["iterations"] >= 1, b
        seen += 1
assert seen == 2 * 2 * 2 * 2 * 2, seen  # N x mode x causal x allocator x reps
PY
"$exe" table "$work/suite.json" "$work/peers.json" --metric peak_fraction >"$work/both.md" 2>&1 ||
  fail "table of the suite and the peers: $(cat "$work/both.md")"
grep -q '^| vanilla ' "$work/both.md" && grep -q '^| torch-naive ' "$work/both.md" || fail "not side by side: $(cat "$work/both.md")"
"$exe" merge "$work/suite.json" "$work/peers.json" --out "$work/merged.json" >/dev/null 2>&1 || fail "merge with the suite's file"
rc=0
"$py" "$root/scripts/peers.py" --attnbench "$exe" --seq 32 --out "$work/peers.json" 2>"$work/again.log" || rc=$?
[ $rc = 2 ] && grep -q "exists" "$work/again.log" || fail "an existing --out was not refused (exit $rc)"
echo "PASS peers.py: 16 points read back by table beside the suite's, the suite's FLOPs, merged"
