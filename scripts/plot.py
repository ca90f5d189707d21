"""Plots of a result file written by `attnbench run --out` or `attnbench sweep --out`.

Three panels per figure: median time against N and tracked working memory against N (log-log,
one line per mechanism and mode, the fitted scaling exponent of time in the legend), and the
speed-up over a baseline mechanism. Also written: PREFIX_crossover.md, the length at which each
mechanism becomes faster than vanilla and than flash (interpolated on the log-log lines between
the grid points, and staying faster for every longer length measured). Failed points are left
out of the lines and listed under the table.

usage: /usr/bin/python3 scripts/plot.py RESULT.json OUT_PREFIX [--baseline vanilla]
       (writes OUT_PREFIX.png, OUT_PREFIX.svg, OUT_PREFIX_crossover.md)

Learning curves of training runs, from the JSON-lines logs `attnbench train --log` (and
`sweep --verb train`) write: training loss and validation accuracy, each against steps and against
wall-clock seconds, one line per run (labelled by mechanism, and by seed where a mechanism has
several).

usage: /usr/bin/python3 scripts/plot.py curves LOG.jsonl [LOG.jsonl ...] OUT_PREFIX [--title TEXT]
       (writes OUT_PREFIX.png, OUT_PREFIX.svg)
"""
import argparse
import json
import math
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402


def load(path):
    """Median time (ms) and tracked bytes per (series, N), and the failed points."""
    doc = json.load(open(path))
    series, failed = defaultdict(dict), []
    for b in doc["benchmarks"]:
        p = b["point"]
        key = (p["attn"], p["mode"], bool(p["causal"]), b["threads"])
        if b.get("error_occurred"):
            failed.append(f'{p["attn"]} N={p["seq"]}: {b["error_message"]}')
            continue
        if b.get("aggregate_name") == "median":
            series[key][p["seq"]] = (b["real_time"], b["peak_bytes"])
    return doc, series, failed


def label_of(key, several_threads):
    mech, mode, causal, threads = key
    s = f"{mech} {mode}" + (" causal" if causal else "")
    return s + (f" {threads}t" if several_threads else "")


def exponent(ns, ts):
    """Slope of log time against log N over the upper half of the grid, where the asymptotic
    term dominates the fixed costs."""
    if len(ns) < 2:
        return float("nan")
    k = max(2, len(ns) // 2 + 1)
    return float(np.polyfit(np.log(ns[-k:]), np.log(ts[-k:]), 1)[0])


def crossover(ns_a, t_a, ns_b, t_b):
    """Smallest N from which series a is faster than b at every common N, interpolated in
    log-log between the last slower and the first faster grid point. None if never; minus the
    first common N if a is faster at every common N."""
    common = sorted(set(ns_a) & set(ns_b))
    if not common:
        return None
    ta = dict(zip(ns_a, t_a))
    tb = dict(zip(ns_b, t_b))
    faster = [ta[n] < tb[n] for n in common]
    if not faster[-1]:
        return None
    i = len(common) - 1
    while i > 0 and faster[i - 1]:
        i -= 1
    if i == 0:
        return -common[0]  # faster already at the shortest common length
    n0, n1 = common[i - 1], common[i]
    d0 = math.log(ta[n0] / tb[n0])  # > 0: a slower
    d1 = math.log(ta[n1] / tb[n1])  # < 0: a faster
    f = d0 / (d0 - d1)
    return math.exp(math.log(n0) + f * (math.log(n1) - math.log(n0)))


def load_curves(paths):
    """Per run (its point name): the loss lines and the validation lines, in step order."""
    runs = defaultdict(lambda: {"loss": [], "val": [], "mechanism": "", "seed": 0, "task": ""})
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                j = json.loads(line)
                r = runs[j["point"]]
                r["mechanism"], r["seed"], r["task"] = j.get("mechanism", "?"), j.get("seed", 0), j.get("task", "")
                if "val_accuracy" in j:
                    r["val"].append((j["step"], j["elapsed_s"], j["val_accuracy"], j.get("val_token_accuracy")))
                else:
                    r["loss"].append((j["step"], j["elapsed_s"], j["loss"]))
    return runs


def curves_main(argv):
    ap = argparse.ArgumentParser(description="learning curves of training runs")
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--title", default="")
    a = ap.parse_args(argv)
    *logs, prefix = a.logs
    if not logs:
        raise SystemExit("plot.py curves: give at least one log and an output prefix")
    runs = load_curves(logs)
    if not runs:
        raise SystemExit("plot.py curves: the logs hold no runs")
    seeds = defaultdict(set)
    for r in runs.values():
        seeds[r["mechanism"]].add(r["seed"])
    mechs = sorted(seeds)
    palette = plt.cm.tab10 if len(mechs) <= 10 else plt.cm.tab20
    colour = {m: palette(i % palette.N) for i, m in enumerate(mechs)}
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    (ax_ls, ax_lt), (ax_as, ax_at) = axes
    for name in sorted(runs, key=lambda n: (runs[n]["mechanism"], runs[n]["seed"])):
        r = runs[name]
        label = r["mechanism"] + (f" seed {r['seed']}" if len(seeds[r["mechanism"]]) > 1 else "")
        style = dict(color=colour[r["mechanism"]], linewidth=1.2, alpha=0.9)
        loss = sorted(r["loss"])
        if loss:
            steps, secs, values = zip(*loss)
            ax_ls.plot(steps, values, label=label, **style)
            ax_lt.plot(secs, values, label=label, **style)
        val = sorted(r["val"])
        if val:
            steps, secs, acc, tokens = zip(*val)
            ax_as.plot(steps, acc, marker="o", markersize=3, label=label, **style)
            ax_at.plot(secs, acc, marker="o", markersize=3, label=label, **style)
            if all(t is not None for t in tokens):  # copy: the per-token accuracy, dashed
                ax_as.plot(steps, tokens, linestyle="--", **style)
                ax_at.plot(secs, tokens, linestyle="--", **style)
    tasks = sorted({r["task"] for r in runs.values()})
    ax_ls.set(xlabel="step", ylabel="training loss", title="training loss against steps")
    ax_lt.set(xlabel="wall-clock seconds", ylabel="training loss", title="training loss against time")
    acc_name = "exact-copy rate (dashed: per token)" if tasks == ["copy"] else "accuracy"
    ax_as.set(xlabel="step", ylabel=f"validation {acc_name}", title=f"validation {acc_name} against steps")
    ax_at.set(xlabel="wall-clock seconds", ylabel=f"validation {acc_name}", title=f"validation {acc_name} against time")
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
    for ax in (ax_ls, ax_lt):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    handles, labels = ax_ls.get_legend_handles_labels()
    if not handles:
        handles, labels = ax_as.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(a.title or f"learning curves: {', '.join(tasks)}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    fig.savefig(prefix + ".png", dpi=110)
    fig.savefig(prefix + ".svg")


def main():
    import sys
    if len(sys.argv) > 1 and sys.argv[1] == "curves":
        return curves_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("prefix")
    ap.add_argument("--baseline", default="vanilla")
    a = ap.parse_args()
    doc, series, failed = load(a.result)
    if not series:
        raise SystemExit(f"{a.result}: no successful point to plot")
    several_threads = len({k[3] for k in series}) > 1
    data = {}
    for key, pts in series.items():
        ns = np.array(sorted(pts))
        data[key] = (ns, np.array([pts[n][0] for n in ns]), np.array([pts[n][1] for n in ns]) / 2**20)

    fig, (ax_t, ax_m, ax_s) = plt.subplots(1, 3, figsize=(24, 7))
    mechs = sorted({k[0] for k in series})
    palette = plt.cm.tab10 if len(mechs) <= 10 else plt.cm.tab20
    colour = {m: palette(i % palette.N) for i, m in enumerate(mechs)}
    style = {"fwd": "-", "fwdbwd": "--", "decode": "-", "train": ":"}

    rows = []
    for key in sorted(data):
        ns, t, mem = data[key]
        mech, mode, causal, threads = key
        fmt = dict(marker="o", color=colour[mech], linestyle=style.get(mode, "-"), markersize=4)
        lab = label_of(key, several_threads)
        slope = exponent(ns, t)
        cross = {}
        for ref in ("vanilla", "flash"):
            rkey = (ref, mode, causal, threads)
            if ref != mech and rkey in data:
                cross[ref] = crossover(ns, t, data[rkey][0], data[rkey][1])
        def show(c):
            if c is None:
                return "never"
            return f"<={-c:,.0f}" if c < 0 else f"{c:,.0f}"
        extra = "".join(f", < {r} from N={show(c)}" for r, c in cross.items())
        ax_t.loglog(ns, t, label=f"{lab} (N^{slope:.2f}{extra})", **fmt)
        ax_m.loglog(ns, np.maximum(mem, 1e-3), label=lab, **fmt)
        bkey = (a.baseline, mode, causal, threads)
        if bkey in data:
            bn, bt, _ = data[bkey]
            common = [n for n in ns if n in set(bn)]
            sp = [dict(zip(bn, bt))[n] / dict(zip(ns, t))[n] for n in common]
            ax_s.loglog(common, sp, label=lab, **fmt)
        rows.append((lab, slope, show(cross.get("vanilla")) if "vanilla" in cross else "-",
                     show(cross.get("flash")) if "flash" in cross else "-"))

    ctx = doc["context"]
    decode = any(k[1] == "decode" for k in data)
    xlabel = "context length N" if decode else "sequence length N"
    ax_t.set(xlabel=xlabel, ylabel="median time per new token (ms)" if decode else "median time per call (ms)",
             title=f'time, {ctx.get("cpu_model", "")}')
    ax_m.set(xlabel=xlabel, ylabel="tracked working memory (MiB)", title="working memory")
    ax_s.set(xlabel=xlabel, ylabel=f"speed-up over {a.baseline} (x)", title=f"speed-up over {a.baseline}")
    ax_s.axhline(1.0, color="grey", linewidth=0.8)
    for ax in (ax_t, ax_m, ax_s):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(0.0, -0.12), ncol=1)
    fig.suptitle(ctx.get("command", ""), fontsize=7)
    fig.tight_layout()
    fig.savefig(a.prefix + ".png", dpi=110, bbox_inches="tight")
    fig.savefig(a.prefix + ".svg", bbox_inches="tight")

    with open(a.prefix + "_crossover.md", "w") as f:
        f.write(f"Scaling exponent of median time (fit over the upper half of the grid) and the length N\n"
                f"from which each series is faster than vanilla and than flash (interpolated log-log;\n"
                f"'never' = not faster at the longest N measured; '<=N' = faster from the shortest N measured). From `{a.result}`.\n\n")
        f.write("| series | time ~ N^k | faster than vanilla from N | faster than flash from N |\n|---|---:|---:|---:|\n")
        for lab, slope, cv, cf in rows:
            f.write(f"| {lab} | {slope:.2f} | {cv} | {cf} |\n")
        if failed:
            f.write("\nFailed points:\n" + "".join(f"- {x}\n" for x in failed))


if __name__ == "__main__":
    main()
