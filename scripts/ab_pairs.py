#!/usr/bin/env python3
"""A/B pairs of two binaries' result files: new/old median time per point, pair by pair.

usage: scripts/ab_pairs.py NEW_PREFIX OLD_PREFIX PAIRS [--match-without FIELD]
  ($ATTNBENCH: the executable whose field table reads the point names; default build/attnbench)
  reads NEW_PREFIX1.json ... NEW_PREFIXn.json and OLD_PREFIX1.json ... (run alternately: new 1,
  old 1, new 2, old 2, ...) and prints, per point, each pair's new/old ratio of median times,
  the medians, and each side's fraction of the GEMM rate its own run measured on the point's
  threads; then, per N, the two-thread speed-up of each file where it has both thread counts.
  --match-without FIELD: a new point pairs with the old point whose name differs from it in
  that field's segment only (e.g. dtype: bf16 points against their float32 twins, one binary).
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import point_names  # noqa: E402


def load(path):
    doc = json.load(open(path))
    ctx = doc["context"]
    one, on = ctx["gemm_gflops_per_s_1thread"], ctx.get("gemm_gflops_per_s_on_threads", {})
    times, flops, threads = {}, {}, {}
    for b in doc["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        times.setdefault(b["name"], []).append(b["real_time"])
        flops[b["name"]], threads[b["name"]] = b["flops"], b["threads"]
    out = {}
    for name, ts in times.items():
        ms = statistics.median(ts)
        gemm = on.get(str(threads[name]), one * threads[name])
        out[name] = (ms, flops[name] / (ms * 1e-3) / 1e9 / gemm)
    return out


def short(name):
    """The mechanism and the fields an A/B usually varies (a file may hold several mechanisms and
    shapes), read through the suite's field table (scripts/point_names.py)."""
    p = point_names.parse(name, point_names.field_table())
    kept = [f"{k}:{v}" for k, v in p.fields.items() if k in ("mode", "B", "H", "N", "causal", "dtype", "threads")]
    return " ".join([p.mechanism] + kept)


def without(name, segment):
    """The name with one field's segment left out (None: the name as it is)."""
    if segment is None:
        return name
    p = point_names.parse(name, point_names.field_table())
    return "/".join(f"{k}:{v}" for k, v in p.segments if k != segment)


def main():
    args = sys.argv[1:]
    segment = None
    if "--match-without" in args:
        at = args.index("--match-without")
        if at + 1 >= len(args):
            sys.exit(__doc__)
        key = args[at + 1]
        segment = next((f["segment"] for f in point_names.field_table() if f["key"] == key), None)
        if segment is None:
            sys.exit(f"error: --match-without {key}: not a point field (attnbench list fields)")
        del args[at:at + 2]
    if len(args) != 3:
        sys.exit(__doc__)
    new, old, pairs = args[0], args[1], int(args[2])
    runs = [(load(f"{new}{i}.json"), load(f"{old}{i}.json")) for i in range(1, pairs + 1)]
    # The old side keyed as the new side's names are looked up.
    old_by_key = [{without(n, segment): t for n, t in b.items()} for _, b in runs]
    for name in runs[0][0]:
        if any(without(name, segment) not in b for b in old_by_key):
            print(f"{short(name):48s} no old point to pair with")
            continue
        v = [(a[name], b[without(name, segment)]) for (a, _), b in zip(runs, old_by_key)]
        print(f"{short(name):48s} new/old {' '.join(f'{a[0] / b[0]:.3f}' for a, b in v)}"
              f"  of GEMM new {' '.join(f'{a[1]:.2f}' for a, _ in v)} old {' '.join(f'{b[1]:.2f}' for _, b in v)}")
    for side, idx in (("new", 0), ("old", 1)):
        for name in runs[0][idx]:
            if name.endswith("/threads:1") and name[:-1] + "2" in runs[0][idx]:
                s = [r[idx][name][0] / r[idx][name[:-1] + "2"][0] for r in runs]
                print(f"{side} two-thread speed-up {short(name[:-len('/threads:1')]):30s} "
                      f"{' '.join(f'{x:.2f}' for x in s)}  median {statistics.median(s):.2f}")


if __name__ == "__main__":
    main()
