"""Time and tracked memory against N (log-log), one line per mechanism and mode, from a result
file written by `attnbench run --out`. Uses the median aggregates; failed points are left out.

usage: /usr/bin/python3 scripts/plot.py RESULT.json OUT_PREFIX   (writes OUT_PREFIX.png/.svg)
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main():
    path, prefix = sys.argv[1], sys.argv[2]
    doc = json.load(open(path))
    series = defaultdict(dict)
    for b in doc["benchmarks"]:
        if b.get("aggregate_name") != "median" or b.get("error_occurred"):
            continue
        p = b["point"]
        key = f'{p["attn"]} {p["mode"]}' + (" causal" if p["causal"] else "")
        series[key][p["seq"]] = (b["real_time"], b["peak_bytes"] / 2**20)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(18, 6.5))
    # One colour per mechanism, one line style per mode, so every line is told apart.
    mechs = sorted({k.split()[0] for k in series})
    palette = plt.cm.tab10 if len(mechs) <= 10 else plt.cm.tab20
    colour = {m: palette(i % palette.N) for i, m in enumerate(mechs)}
    style = {"fwd": "-", "fwdbwd": "--", "decode": "-", "train": ":"}
    for key in sorted(series):
        ns = np.array(sorted(series[key]))
        t = np.array([series[key][n][0] for n in ns])
        m = np.array([series[key][n][1] for n in ns])
        slope = np.polyfit(np.log(ns), np.log(t), 1)[0] if len(ns) > 1 else float("nan")
        mech, mode = key.split()[:2]
        fmt = dict(marker="o", color=colour[mech], linestyle=style.get(mode, "-"), markersize=4)
        ax_t.loglog(ns, t, label=f"{key} (time ~ N^{slope:.2f})", **fmt)
        ax_m.loglog(ns, m, label=key, **fmt)
    ctx = doc["context"]
    decode = "decode" in " ".join(series)
    xlabel = "context length N" if decode else "sequence length N"
    ax_t.set(xlabel=xlabel, ylabel="median time per new token (ms)" if decode else "median time per call (ms)",
             title=f'time, {ctx["threads"]} thread(s), {ctx["cpu_model"]}')
    ax_m.set(xlabel=xlabel, ylabel="tracked working memory (MiB)", title="working memory")
    for ax in (ax_t, ax_m):
        ax.grid(True, which="both", alpha=0.3)
    # Legends beside each panel, so no line is hidden behind one.
    ax_t.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax_m.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(ctx["command"], fontsize=7)
    fig.tight_layout()
    fig.savefig(prefix + ".png", dpi=120)
    fig.savefig(prefix + ".svg")


if __name__ == "__main__":
    main()
