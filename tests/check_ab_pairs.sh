#!/usr/bin/env bash
# scripts/ab_pairs.py on two alternated pairs of tiny runs of the same binary: one ratio per pair
# and point, each side's fraction of its own run's GEMM rate, the two-thread speed-up per N;
# wrong arguments print the usage and fail.
# usage: tests/check_ab_pairs.sh ATTNBENCH_EXE
set -euo pipefail
exe=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=/usr/bin/python3
work=$(mktemp -d -t attnbench-ab.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for i in 1 2; do
  for side in new old; do
    "$exe" run --attn flash --seq 64,128 --heads 2 --dhead 16 --threads 1,2 --reps 2 --min-time 0 \
      --out "$work/$side$i.json" >/dev/null 2>&1 || fail "run $side$i"
  done
done
out=$(ATTNBENCH="$exe" "$py" "$root/scripts/ab_pairs.py" "$work/new" "$work/old" 2) || fail "ab_pairs.py: $out"
[ "$(grep -c 'new/old [0-9.]* [0-9.]*  of GEMM new [0-9.]* [0-9.]* old [0-9.]* [0-9.]*$' <<<"$out")" = 4 ] ||
  fail "expected 4 points with two pairs each in: $out"
[ "$(grep -c '^new two-thread speed-up .*N:64 .* median [0-9.]*$' <<<"$out")" = 1 ] || fail "no speed-up line for N 64 in: $out"
[ "$(grep -c '^old two-thread speed-up' <<<"$out")" = 2 ] || fail "expected the old side's speed-ups in: $out"
if "$py" "$root/scripts/ab_pairs.py" "$work/new" 2>/dev/null; then fail "accepted one argument"; fi
echo "ab_pairs: ok"
