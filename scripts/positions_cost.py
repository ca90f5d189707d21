#!/usr/bin/python3
"""What each position encoding adds to a mechanism: a markdown table from `attnbench run
--positions none,alibi,bias,shaw` (or `none,rope` for the kernel family, which rotates its feature
maps inside) result files; the encodings' columns are those the files hold. Per mechanism, N and mode: the median time without
an encoding, then each encoding's median time as a change against it (the medians of every kept
repetition), the tracked peak memory without and with each, and the largest spread (coefficient
of variation of the repetitions) among the row's points: a row above 10% was measured while
something else ran and says less than the others.

usage: positions_cost.py RESULTS.json [RESULTS.json ...] > table.md
"""
import json
import statistics
import sys
from collections import defaultdict

ORDER = ("alibi", "bias", "shaw", "rope")


def encoding(name):
    """The family of a point's --positions value ("bias:32:128" -> "bias")."""
    return (name or "none").split(":")[0]


def main(paths):
    times = defaultdict(list)
    peak = {}
    spelled = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for b in data["benchmarks"]:
            if b.get("run_type") != "iteration" or "real_time" not in b:
                continue
            p = b["point"]
            params = " ".join(f"{k}={v}" for k, v in sorted(p.get("params", {}).items()))
            key = (p["attn"], params, p["heads"], p["seq"], p["mode"], bool(p.get("causal")))
            enc = encoding(p.get("positions"))
            spelled[enc] = p.get("positions") or "none"
            times[key + (enc,)].append(b["real_time"])
            peak[key + (enc,)] = b.get("peak_bytes", 0.0)
    ENCODINGS = tuple(e for e in ORDER if e in spelled)
    rows = sorted({k[:6] for k in times}, key=lambda k: (k[0], k[1], k[5], k[3], k[4]))
    causal = any(k[5] for k in rows)  # a causal column only when some point is causal
    head = ["mechanism", "params"] + (["causal"] if causal else []) + ["H", "N", "mode", "none ms"]
    head += [f"{spelled.get(e, e)}" for e in ENCODINGS]
    head += ["peak MiB none"] + [f"peak MiB {e}" for e in ENCODINGS] + ["max cv %"]
    print("| " + " | ".join(head) + " |")
    text = 6 if causal else 5
    print("|" + "|".join(["---"] * text + ["---:"] * (len(head) - text)) + "|")
    for k in rows:
        base = times.get(k + ("none",))
        if not base:
            continue
        b = statistics.median(base)
        cells = [k[0], k[1] or ""] + (["yes" if k[5] else "no"] if causal else []) + [str(k[2]), str(k[3]), k[4], f"{b:.4g}"]
        for e in ENCODINGS:
            t = times.get(k + (e,))
            cells.append(f"{statistics.median(t):.4g} ({100 * (statistics.median(t) / b - 1):+.0f}%)" if t else "")
        cells.append(f"{peak.get(k + ('none',), 0) / 2**20:.2f}")
        for e in ENCODINGS:
            cells.append(f"{peak[k + (e,)] / 2**20:.2f}" if k + (e,) in peak else "")
        cvs = [statistics.pstdev(t) / statistics.mean(t) for e in ("none",) + ENCODINGS
               if len(t := times.get(k + (e,), [])) > 1]
        cells.append(f"{100 * max(cvs):.0f}" if cvs else "")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1:])
