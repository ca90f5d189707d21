"""Plots of a result file written by `attnbench run --out` or `attnbench sweep --out`.

Three panels per figure: median time against N and tracked working memory (MiB) against N
(log-log, plain tick labels at the measured N, one line per mechanism and mode, the fitted scaling
exponent of time in the legend), and the speed-up over a baseline mechanism (flash when the
baseline is not in the file). Each mechanism has its own colour and marker, the colours grouped by
family (from `attnbench list`); one legend, outside the panels; the title names the machine, the
threads and the shape. Also written: PREFIX_crossover.md, the length at which each
mechanism becomes faster than vanilla and than flash (interpolated on the log-log lines between
the grid points, and staying faster for every longer length measured). Failed points are left
out of the lines and listed under the table.

usage: /usr/bin/python3 scripts/plot.py RESULT.json OUT_PREFIX [--baseline vanilla] [--attnbench build/attnbench]
       (writes OUT_PREFIX.png, OUT_PREFIX.svg, OUT_PREFIX_crossover.md)

Learning curves of training runs, from the JSON-lines logs `attnbench train --log` (and
`sweep --verb train`) write: training loss and validation accuracy, each against steps and against
wall-clock seconds, one line per run (labelled by mechanism, by task where the logs hold several,
each task in a line style of its own, and by seed where a mechanism has several).

usage: /usr/bin/python3 scripts/plot.py curves LOG.jsonl [LOG.jsonl ...] OUT_PREFIX [--title TEXT]
       (writes OUT_PREFIX.png, OUT_PREFIX.svg)

The speed-accuracy-memory chart of LRA (Tay et al. 2020, Figure 3) from a training result file
(`attnbench train --preset lra-accuracy --out`): one bubble per mechanism at its test accuracy
averaged over the tasks it finished (y) against its training steps per second relative to the
baseline, as the geometric mean over those tasks (x), bubble area proportional to its tracked
memory relative to the baseline (geometric mean); and one panel per task with that task's
accuracy against its steps/s, area by memory. A mechanism without every task is drawn hollow and
its label says how many tasks it has.

With --speed TIMED.json (`attnbench run --preset lra-accuracy --out`: one training step of each
configuration, timed on an otherwise idle machine), the steps/s and memory come from those timed
steps (their medians) instead of the training runs' own wall clock, which counts evaluation and
whatever else shared the core during hours of training. The title names where each half came
from: the machine and command of the timed steps, and every machine whose training runs the result
file holds (its own, its resumptions' and its merged sources'), since a grid moved between machines
keeps the first one's context.

usage: /usr/bin/python3 scripts/plot.py bubbles RESULT.json OUT_PREFIX [--speed TIMED.json] [--baseline vanilla]

The figures of `attnbench history report` (median time against the runs of a history, the
regressions ringed), from the JSON description it writes.

usage: /usr/bin/python3 scripts/plot.py history FIGURES.json OUT_PREFIX   (writes OUT_PREFIX_0.png, ...)

The recall-cost frontier of multi-query associative recall (the Based paper's Figure 2 for the
mechanisms here) from a zoology-mqar result file (`attnbench train --preset zoology-mqar --out`):
at one length N, the test accuracy of each mechanism configuration and d_model (the best over
learning rates, chosen by validation accuracy) against (a) its inference state per token and
layer, measured by `attnbench run` on the same configuration (the decode state: a KV cache for
softmax attention, the recurrent state for linear attention; a forward call's tracked memory for
a mechanism without a decode step), and (b) its training throughput (tokens/s of its own steps, or
with --speed of the same configurations' steps timed by `attnbench run --preset zoology-mqar`).
One line per mechanism through its configurations.

usage: /usr/bin/python3 scripts/plot.py frontier RESULT.json OUT_PREFIX [--seq N] [--speed TIMED.json]
       [--attnbench build/attnbench]

Length extrapolation across position encodings from a training result file whose runs were tested
at other lengths (`attnbench train --test-seq`, the positions-extrapolation preset): test accuracy
against the test length, one panel per task and trained length, one line per (mechanism,
encoding), the trained length marked. A length a run could not be tested at (learned positions
exist at the trained length only) is left out of its line.

usage: /usr/bin/python3 scripts/plot.py extrapolation RESULT.json OUT_PREFIX
       [--attnbench build/attnbench]
       (writes OUT_PREFIX.png, OUT_PREFIX.svg)
"""
import argparse
import json
import math
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import point_names  # noqa: E402


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


def config_words(point, table):
    """A run's configuration as "key=value" words: its name's segments (read through the field
    table, scripts/point_names.py) but the mechanism and the seed."""
    segments = point_names.parse(point, table).segments[1:]
    return [f"{k}={v}" for k, v in segments if k != "seed"]


def load_curves(paths, table):
    """Per run (its point name): the loss lines and the validation lines, in step order."""
    runs = defaultdict(lambda: {"loss": [], "val": [], "mechanism": "", "seed": 0, "task": "", "config": []})
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                j = json.loads(line)
                r = runs[j["point"]]
                r["mechanism"], r["seed"], r["task"] = j.get("mechanism", "?"), j.get("seed", 0), j.get("task", "")
                r["config"] = config_words(j["point"], table)
                if "val_accuracy" in j:
                    r["val"].append((j["step"], j["elapsed_s"], j["val_accuracy"], j.get("val_token_accuracy")))
                else:
                    r["loss"].append((j["step"], j["elapsed_s"], j["loss"]))
    return runs


def curves_main(argv):
    ap = argparse.ArgumentParser(description="learning curves of training runs")
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--title", default="")
    ap.add_argument("--attnbench", default=None, help="the executable whose field table reads the run names "
                    "(default: $ATTNBENCH, else build/attnbench)")
    a = ap.parse_args(argv)
    *logs, prefix = a.logs
    if not logs:
        raise SystemExit("plot.py curves: give at least one log and an output prefix")
    runs = load_curves(logs, point_names.field_table(a.attnbench))
    if not runs:
        raise SystemExit("plot.py curves: the logs hold no runs")
    # A line's identity, as a row of `attnbench table`: the mechanism, with what tells its
    # configurations apart where the logs hold several of it on one task (reformer with 1 and 4
    # hashing rounds; the Transformer with more steps and at twice the width), and its seed where
    # there are several.
    seeds, configs = defaultdict(set), defaultdict(set)
    for r in runs.values():
        seeds[r["mechanism"]].add(r["seed"])
        configs[(r["mechanism"], r["task"])].add(tuple(r["config"]))

    def series(r):
        others = configs[(r["mechanism"], r["task"])]
        if len(others) <= 1:
            return r["mechanism"]
        differing = [w for w in r["config"] if not all(w in o for o in others)]
        return r["mechanism"] + " " + " ".join(differing)
    # Logs of several tasks (the LRA grid): a line also names its task, drawn in a style of its own.
    tasks = sorted({r["task"] for r in runs.values()})
    task_style = {t: ["-", "--", "-.", ":", (0, (5, 1))][i % 5] for i, t in enumerate(tasks)} if len(tasks) > 1 else {}
    names = sorted({series(r) for r in runs.values()})
    palette = plt.cm.tab10 if len(names) <= 10 else plt.cm.tab20
    colour = {m: palette(i % palette.N) for i, m in enumerate(names)}
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    (ax_ls, ax_lt), (ax_as, ax_at) = axes
    for name in sorted(runs, key=lambda n: (runs[n]["mechanism"], runs[n]["seed"])):
        r = runs[name]
        label = series(r) + (f" {r['task']}" if task_style else "")
        label += f" seed {r['seed']}" if len(seeds[r["mechanism"]]) > 1 else ""
        style = dict(color=colour[series(r)], linewidth=1.2, alpha=0.9, linestyle=task_style.get(r["task"], "-"))
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
                ax_as.plot(steps, tokens, **{**style, "linestyle": "--"})
                ax_at.plot(secs, tokens, **{**style, "linestyle": "--"})
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
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    handles, labels = ax_ls.get_legend_handles_labels()
    if not handles:
        handles, labels = ax_as.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(a.title or f"learning curves: {', '.join(tasks)}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    fig.savefig(prefix + ".png", dpi=110)
    fig.savefig(prefix + ".svg")


def mechanism_families(exe):
    """{mechanism: family} in the registry's order, from `attnbench list --wide` (the one list of
    mechanisms); empty when the binary is not there (then every mechanism is its own family)."""
    import subprocess
    from mechanisms_doc import markdown_rows
    if not exe or not os.path.exists(exe):
        return {}
    try:
        text = subprocess.run([exe, "list", "--wide"], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    rows = markdown_rows(text)
    col = rows[0].index("family")
    return {r[0]: r[col] for r in rows[1:]}


# One colour map per family: the mechanisms of a family are shades of one hue, told apart by
# their markers as well, so 15 lines stay distinguishable in print and for colour-blind readers.
FAMILY_MAPS = ["Blues", "Oranges", "Greens", "Purples", "Reds", "Greys", "YlOrBr", "PuRd"]  # by family order
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "8", "d", "H"]


def mechanism_styles(mechs, families):
    """{mechanism: (colour, marker)}: families in registry order, shades within a family."""
    order = list(families) + sorted(m for m in mechs if m not in families)
    present = [m for m in order if m in mechs]
    fams = []
    for m in present:
        f = families.get(m, m)
        if f not in fams:
            fams.append(f)
    styles = {}
    for fi, fam in enumerate(fams):
        members = [m for m in present if families.get(m, m) == fam]
        cmap = plt.get_cmap(FAMILY_MAPS[fi % len(FAMILY_MAPS)])
        for j, m in enumerate(members):
            shade = 0.95 - 0.45 * j / max(1, len(members) - 1) if len(members) > 1 else 0.75
            styles[m] = (cmap(shade), MARKERS[present.index(m) % len(MARKERS)])
    return styles


def plain_log_axis(axis, values=None):
    """A log axis labelled with plain numbers: 512, 1024, 16384 (not 5x10^2); with `values`, a
    tick at each of them (the measured sequence lengths)."""
    # Whole numbers as integers; others to 3 significant digits: an axis spanning less than a decade
    # gets linear ticks (2, 2.5, 3, ...) from the LogLocator, which "%.0f" would print as 2 2 3.
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.0f}" if v == round(v) else f"{v:.3g}")
    if values is not None:
        axis.set_major_locator(matplotlib.ticker.FixedLocator(sorted(values)))
        axis.set_minor_locator(matplotlib.ticker.NullLocator())
    else:
        axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axis.set_major_formatter(fmt)


def read_result_file(path):
    """The JSON of a result file, or exit naming the file and what is wrong with it."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"plot.py bubbles: cannot read {path}: {e}")


def load_training(path):
    """{task: {mechanism: (test accuracy, steps/s, tracked bytes)}} of the successful training
    points of a result file, and its context. With several points per (task, mechanism), e.g.
    seeds, the mean accuracy and the median speed and memory."""
    doc = read_result_file(path)
    acc = defaultdict(lambda: defaultdict(list))
    for b in doc.get("benchmarks", []):
        p = b.get("point", {})
        if b.get("status", "OK") != "OK" or p.get("mode") != "train" or "accuracy" not in b:
            continue
        acc[p.get("task", "?")][p["attn"]].append((b["accuracy"], b.get("steps_per_s"), b.get("peak_bytes")))
    out = {}
    for task, per in acc.items():
        out[task] = {m: (float(np.mean([v[0] for v in vs])), float(np.median([v[1] for v in vs])),
                         float(np.median([v[2] for v in vs]))) for m, vs in per.items()}
    return out, doc.get("context", {})


def load_timed_steps(path):
    """{(task, mechanism): (steps/s, tracked bytes)} from the medians of the model-level training
    steps of a `run` result file."""
    doc = read_result_file(path)
    timed = {}
    for b in doc.get("benchmarks", []):
        p = b.get("point", {})
        if b.get("aggregate_name") != "median" or p.get("mode") != "train" or b.get("error_occurred"):
            continue
        if b.get("time_unit") != "ms":
            raise SystemExit(f"plot.py bubbles: {path}: {b['name']} is timed in {b.get('time_unit')}, not ms")
        timed[(p.get("task"), p["attn"])] = (1000.0 / b["real_time"], b["peak_bytes"])
    return timed


def machines_that_ran(ctx):
    """The machines whose runs a result file holds, in order, once each: the file's own (the first
    invocation's, or a merged file's first source's), each merged source's own, and each
    resumption that finished a point. Resumptions from before machine_id was recorded are plain
    strings: unknown."""
    machines = []

    def add(m):
        if m and m not in machines:
            machines.append(m)

    add(ctx.get("machine_id") or ctx.get("cpu_model"))
    for source in [ctx] + ctx.get("merged_from", []):
        if source is not ctx:
            add(source.get("machine_id"))  # a merged source's own first invocation
        for r in source.get("resumed_by", []):
            if isinstance(r, dict) and r.get("points"):
                add(r.get("machine_id") or r.get("cpu_model"))
    return machines


def bubbles_main(argv):
    ap = argparse.ArgumentParser(description="LRA's speed-accuracy-memory chart of a training result file")
    ap.add_argument("result")
    ap.add_argument("prefix")
    ap.add_argument("--baseline", default="vanilla", help="the reference of speed and memory (flash instead when flash finished more tasks)")
    ap.add_argument("--attnbench", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                        "build", "attnbench"))
    ap.add_argument("--speed", help="a `run --preset lra-accuracy` result: steps/s and memory of timed steps")
    a = ap.parse_args(argv)
    data, ctx = load_training(a.result)
    # Accuracy does not depend on the machine; speed does, so the title names where each came from.
    provenance = f"accuracy: {os.path.basename(a.result)}, runs on {', '.join(machines_that_ran(ctx))}"
    if not data:
        raise SystemExit(f"{a.result}: no finished training point (mode train, status OK) to plot")
    speed_source = "the training runs' wall clock"
    if a.speed:
        timed = load_timed_steps(a.speed)
        missing = [f"{m} on {t}" for t in data for m in data[t] if (t, m) not in timed]
        if missing:
            raise SystemExit(f"plot.py bubbles: {a.speed} has no timed step of {', '.join(sorted(missing))}")
        data = {t: {m: (acc, *timed[(t, m)]) for m, (acc, _, _) in per.items()} for t, per in data.items()}
        speed_source = "timed steps, " + os.path.basename(a.speed)
        speed_ctx = read_result_file(a.speed).get("context", {})
        provenance = (f"speed and memory: {speed_ctx.get('machine_id') or speed_ctx.get('cpu_model', '?')}, "
                      f"{speed_ctx.get('command', a.speed)}\n{provenance}")
    else:
        provenance = f"speed and memory: the training runs' wall clock\n{provenance}: {ctx.get('command', a.result)}"
    tasks = sorted(data)
    mechs = {m for per in data.values() for m in per}
    # The reference must cover the tasks the others finished: a bubble averages only over the tasks
    # where it and the reference both finished, so a reference with one task would reduce every
    # bubble to that task. Of the requested one and flash, the one that finished more tasks.
    finished = {m: sum(m in per for per in data.values()) for m in (a.baseline, "flash")}
    baseline = max((m for m in (a.baseline, "flash") if finished[m]), key=lambda m: finished[m], default=None)
    if baseline is None:
        raise SystemExit(f"{a.result}: neither {a.baseline} nor flash trained: no reference for speed and memory")
    styles = mechanism_styles(mechs, mechanism_families(a.attnbench))

    # 1. Per mechanism, over the tasks where it and the baseline both finished.
    summary = {}
    for m in mechs:
        common = [t for t in tasks if m in data[t] and baseline in data[t]]
        if not common:
            continue
        speed = math.exp(np.mean([math.log(data[t][m][1] / data[t][baseline][1]) for t in common]))
        memory = math.exp(np.mean([math.log(data[t][m][2] / data[t][baseline][2]) for t in common]))
        summary[m] = (float(np.mean([data[t][m][0] for t in common])), speed, memory, len(common))

    # 2. The overview and one panel per task.
    ncols = min(3, len(tasks))
    nrows = 1 + math.ceil(len(tasks) / ncols)
    fig = plt.figure(figsize=(6 * ncols, 4.6 * nrows))
    grid = fig.add_gridspec(nrows, ncols)
    ax0 = fig.add_subplot(grid[0, :])
    area = 900.0  # points^2 of the baseline's bubble
    full = len(tasks)
    for m, (acc, speed, memory, n) in sorted(summary.items(), key=lambda kv: kv[1][1]):
        colour, marker = styles[m]
        hollow = n < full
        ax0.scatter([speed], [100 * acc], s=area * memory, facecolors="none" if hollow else [colour],
                    edgecolors=[colour] if hollow else "black", linewidths=1.5 if hollow else 0.5, alpha=0.75)
        ax0.annotate(m + (f" ({n}/{full} tasks)" if hollow else ""), (speed, 100 * acc), fontsize=8,
                     xytext=(6, 6), textcoords="offset points")
    ax0.set_xscale("log")
    ax0.margins(0.15)
    plain_log_axis(ax0.xaxis)
    ax0.axvline(1.0, color="grey", linewidth=0.8)
    ax0.set(xlabel=f"training steps/s relative to {baseline} (geometric mean over tasks; {speed_source})",
            ylabel="test accuracy, mean over tasks (%)",
            title=f"speed, accuracy and memory (bubble area: tracked memory relative to {baseline})")
    ax0.grid(True, alpha=0.3)
    for i, t in enumerate(tasks):
        ax = fig.add_subplot(grid[1 + i // ncols, i % ncols])
        base_mem = data[t].get(baseline, (0, 0, None))[2] or max(v[2] for v in data[t].values())
        for m, (acc, sps, mem) in data[t].items():
            colour, marker = styles[m]
            ax.scatter([sps], [100 * acc], s=area * 0.5 * mem / base_mem, color=colour, edgecolors="black",
                       linewidths=0.5, alpha=0.75)
            ax.annotate(m, (sps, 100 * acc), fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.set_xscale("log")
        ax.margins(0.2)
        plain_log_axis(ax.xaxis)
        ax.set(xlabel="training steps/s" + (" (timed)" if a.speed else ""), ylabel="test accuracy (%)", title=t)
        ax.grid(True, alpha=0.3)
    fig.suptitle(provenance, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(a.prefix + ".png", dpi=110)
    fig.savefig(a.prefix + ".svg")


def recall_runs(paths, seq=None):
    """The best learning rate (by validation accuracy, a rate's seeds by their mean, as `attnbench
    table` chooses) of each (mechanism configuration, d_model) at one length N (the largest in the
    files unless given) of zoology-mqar result files (the grid, and files of further seeds):
    {(mechanism, params tuple, d_model): (test accuracy, the seeds' mean, tokens/s of its first
    run's own steps, point)}."""
    runs, ctx = [], None
    for path in paths:
        doc = read_result_file(path)
        ctx = ctx if ctx is not None else doc.get("context", {})
        runs += [b for b in doc.get("benchmarks", []) if b.get("run_type") == "iteration" and not b.get("error_occurred")
                 and b.get("point", {}).get("task") == "mqar" and "accuracy" in b]
    if not runs:
        raise SystemExit(f"plot.py frontier: {', '.join(paths)} hold no finished mqar training run")
    n = seq or max(b["point"]["seq"] for b in runs)
    by_rate = defaultdict(list)  # (configuration, lr) -> its seeds' runs
    for b in runs:
        p = b["point"]
        if p["seq"] == n:
            by_rate[((p["attn"], tuple(sorted(p.get("params", {}).items())), p["dmodel"]), p["lr"])].append(b)
    best = {}
    for (key, _), rs in by_rate.items():
        val = sum(b["val_accuracy"] for b in rs) / len(rs)
        if key not in best or val > best[key][3]:
            first = rs[0]
            tokens = first.get("tokens_per_s") or 1000.0 / first["real_time"] * first["point"]["batch"] * first["point"]["seq"]
            best[key] = (sum(b["accuracy"] for b in rs) / len(rs), tokens, first["point"], val)
    return n, {k: v[:3] for k, v in best.items()}, ctx


def inference_bytes_per_token(exe, point):
    """Tracked bytes per token of one attention layer of the point's model at inference, measured by
    attnbench: the decode state (KV cache or recurrent state after N tokens) where the mechanism has
    a decode step, else the working memory of a forward call; batch 1, the model's heads."""
    import subprocess
    mech, n, heads, d = point["attn"], point["seq"], point["heads"], point["dmodel"]
    base = [exe, "run", "--attn", mech, "--seq", str(n), "--heads", str(heads), "--dhead", str(d // heads), "--batch", "1",
            "--reps", "1", "--min-time", "0", "--warmup", "1", "--out", "-"]
    for k, v in point.get("params", {}).items():
        base += ["--param", f"{k}={v}"]
    if point.get("causal"):
        base.append("--causal")
    for mode in ("decode", "fwd"):
        proc = subprocess.run(base + ["--mode", mode], capture_output=True, text=True)
        if proc.returncode != 0:
            continue
        for b in json.loads(proc.stdout)["benchmarks"]:
            if b.get("run_type") == "iteration" and not b.get("error_occurred"):
                return b["peak_bytes"] / n, mode
    raise SystemExit(f"plot.py frontier: attnbench could not measure {mech} at N={n}: {proc.stderr.strip()}")


def frontier_main(argv):
    ap = argparse.ArgumentParser(description="the recall-cost frontier of a zoology-mqar result file")
    ap.add_argument("result")
    ap.add_argument("prefix")
    ap.add_argument("--also", action="append", default=[],
                    help="a result file of further seeds of the same grid (repeatable): a rate's seeds are averaged")
    ap.add_argument("--seq", type=int, help="the length N to draw (default: the longest in the file)")
    ap.add_argument("--speed", help="a `run --preset zoology-mqar` result: tokens/s of timed training steps instead of "
                                    "the runs' own wall clock")
    ap.add_argument("--attnbench", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                        "build", "attnbench"))
    a = ap.parse_args(argv)
    n, best, ctx = recall_runs([a.result] + a.also, a.seq)
    if not best:
        raise SystemExit(f"plot.py frontier: {a.result} has no finished run at N={n}")
    speed_source = "its own run's wall clock"
    if a.speed:
        # Timed steps of the same configurations (the training point without its recipe).
        timed = {}
        for b in read_result_file(a.speed).get("benchmarks", []):
            p = b.get("point", {})
            if b.get("aggregate_name") == "median" and not b.get("error_occurred"):
                timed[(p["attn"], tuple(sorted(p.get("params", {}).items())), p["dmodel"], p["seq"])] = \
                    1000.0 / b["real_time"] * p["batch"] * p["seq"]
        missing = [k for k in best if (*k, n) not in timed]
        if missing:
            raise SystemExit(f"plot.py frontier: {a.speed} has no timed step of {', '.join(f'{m} d{d}' for m, _, d in missing)}")
        best = {k: (v[0], timed[(*k, n)], v[2]) for k, v in best.items()}
        speed_source = "timed steps, " + os.path.basename(a.speed)
    mechs = {k[0] for k in best}
    styles = mechanism_styles(mechs, mechanism_families(a.attnbench))
    fig, (ax_m, ax_t) = plt.subplots(1, 2, figsize=(15, 6.5))
    measured = {}
    for key, (acc, tokens, point) in best.items():
        measured[key] = (acc, tokens, *inference_bytes_per_token(a.attnbench, point))
    for m in sorted(mechs):
        colour, marker = styles[m]
        pts = sorted((v[2], v[1], v[0], k) for k, v in measured.items() if k[0] == m)
        for ax, x_of in ((ax_m, lambda p: p[0]), (ax_t, lambda p: p[1])):
            xs = [x_of(p) for p in pts]
            ys = [100 * p[2] for p in pts]
            order = np.argsort(xs)
            ax.plot(np.array(xs)[order], np.array(ys)[order], marker=marker, color=colour, linewidth=1, markersize=7,
                    label=m if ax is ax_m else None)
            for x, y, p in zip(xs, ys, pts):
                params, d = p[3][1], p[3][2]
                what = " ".join(f"{k}={v}" for k, v in params if k in ("window", "features", "block", "k", "bucket_size"))
                ax.annotate(f"{m} d{d}" + (f" {what}" if what else ""), (x, y), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
    modes = sorted({v[3] for v in measured.values()})
    ax_m.set(xscale="log", xlabel="inference state per token and layer (bytes)",
             ylabel="MQAR test accuracy (%)", title=f"recall against memory, N = {n}")
    ax_t.set(xscale="log", xlabel=f"training throughput (tokens/s; {speed_source})", ylabel="MQAR test accuracy (%)",
             title=f"recall against speed, N = {n}")
    for ax in (ax_m, ax_t):
        plain_log_axis(ax.xaxis)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(-2, 102)
    fig.legend(loc="center right", fontsize=8)
    fig.suptitle(f"{os.path.basename(a.result)}: {ctx.get('command', '')[:140]}\n(best over learning rates by validation "
                 f"accuracy, a rate's seeds averaged; memory: the decode state where a mechanism has a decode step, else a forward call's tracked working "
                 f"memory, measured by attnbench run --mode {'/'.join(modes)})", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.88, 0.94))
    fig.savefig(a.prefix + ".png", dpi=110)
    fig.savefig(a.prefix + ".svg")


def extrapolation_main(argv):
    ap = argparse.ArgumentParser(description="test accuracy against test length, a line per position encoding")
    ap.add_argument("result")
    ap.add_argument("prefix")
    ap.add_argument("--attnbench", default=None, help="unused; accepted like the other plots")
    a = ap.parse_args(argv)
    doc = read_result_file(a.result)
    lines = defaultdict(dict)  # (task, trained N) -> {(mechanism, encoding): {length: accuracy}}
    for b in doc.get("benchmarks", []):
        p = b.get("point", {})
        if b.get("run_type") != "iteration" or b.get("error_occurred") or "accuracy" not in b:
            continue
        acc = {p["seq"]: b["accuracy"]}
        for k, v in b.items():
            if k.startswith("accuracy_at_") and v is not None:
                acc[int(k[len("accuracy_at_"):])] = v
        lines[(p.get("task", "?"), p["seq"])][(p["attn"], p.get("positions", "?"))] = acc
    if not lines:
        raise SystemExit(f"plot.py extrapolation: {a.result} holds no finished training run")
    panels = sorted(lines)
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 6), squeeze=False)
    linestyles = {"flash": "-", "sliding": "--", "local": ":"}
    encodings = sorted({e for per in lines.values() for (_, e) in per})
    colours = plt.get_cmap("tab10")
    for ax, (task, trained) in zip(axes[0], panels):
        for (mech, enc), acc in sorted(lines[(task, trained)].items()):
            ns = sorted(acc)
            ax.plot(ns, [100 * acc[n] for n in ns], marker="o", markersize=4, linestyle=linestyles.get(mech, "-."),
                    color=colours(encodings.index(enc) % 10), label=f"{mech}, {enc}")
        ax.axvline(trained, color="grey", linewidth=0.8, linestyle=":")
        if task == "induction":  # the answer is one of the 15 ordinary tokens
            ax.axhline(100 / 15, color="grey", linewidth=0.8, linestyle="--", label="chance (1/15)")
        ax.set(xscale="log", xlabel="test length N", ylabel="test accuracy (%)", title=f"{task}, trained at N = {trained}")
        plain_log_axis(ax.xaxis, sorted({n for acc in lines[(task, trained)].values() for n in acc}))
        ax.set_ylim(-2, 102)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{os.path.basename(a.result)}: length extrapolation by position encoding\n"
                 f"{doc.get('context', {}).get('command', '')[:140]}", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(a.prefix + ".png", dpi=110)
    fig.savefig(a.prefix + ".svg")


def history_main(argv):
    """`attnbench history report`'s figures: FIGURES.json holds a list of {title, runs (x labels,
    in date order), lines: [{label, x (run indices), y (median ms), regression (bools)}]}; figure
    i goes to PREFIX_i.png, median time (log) against the runs, a line per mechanism and N, the
    runs the regression gate flags ringed in red."""
    ap = argparse.ArgumentParser(description="the figures of attnbench history report")
    ap.add_argument("figures")
    ap.add_argument("prefix")
    a = ap.parse_args(argv)
    figures = json.load(open(a.figures))
    for i, f in enumerate(figures):
        fig, ax = plt.subplots(figsize=(9, 4.2))
        for line in f["lines"]:
            (drawn,) = ax.plot(line["x"], line["y"], marker="o", markersize=3, linewidth=1.2, label=line["label"])
            bad = [(x, y) for x, y, r in zip(line["x"], line["y"], line["regression"]) if r]
            if bad:
                ax.scatter([b[0] for b in bad], [b[1] for b in bad], s=90, facecolors="none", edgecolors="red",
                           linewidths=1.6, zorder=5)
        ax.set_yscale("log")
        ax.set_ylabel("median time (ms)")
        ax.set_xticks(range(len(f["runs"])))
        ax.set_xticklabels(f["runs"], fontsize=7)
        ax.set_xlim(-0.5, max(0.5, len(f["runs"]) - 0.5))
        ax.set_title(f["title"], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        fig.savefig(f"{a.prefix}_{i}.png", dpi=100)
        plt.close(fig)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "history":
        return history_main(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "curves":
        return curves_main(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "frontier":
        return frontier_main(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "bubbles":
        return bubbles_main(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "extrapolation":
        return extrapolation_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("prefix")
    ap.add_argument("--baseline", default="vanilla",
                    help="the speed-up panel's reference (flash when this one is not in the file)")
    ap.add_argument("--attnbench", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                        "build", "attnbench"),
                    help="the binary whose `list` names each mechanism's family (the colours)")
    a = ap.parse_args()
    doc, series, failed = load(a.result)
    if not series:
        raise SystemExit(f"{a.result}: no successful point to plot")
    several_threads = len({k[3] for k in series}) > 1
    data = {}
    for key, pts in series.items():
        ns = np.array(sorted(pts))
        data[key] = (ns, np.array([pts[n][0] for n in ns]), np.array([pts[n][1] for n in ns]) / 2**20)

    mechs = {k[0] for k in series}
    styles = mechanism_styles(mechs, mechanism_families(a.attnbench))
    baseline = a.baseline
    if not any(k[0] == baseline for k in data):
        baseline = "flash" if any(k[0] == "flash" for k in data) else None

    fig, (ax_t, ax_m, ax_s) = plt.subplots(1, 3, figsize=(20, 6.5))
    linestyle = {"fwd": "-", "fwdbwd": "--", "decode": "-", "train": ":"}
    all_ns = set()
    rows = []
    order = {m: i for i, m in enumerate(styles)}
    for key in sorted(data, key=lambda k: (order.get(k[0], 99), k[1:])):
        ns, t, mem = data[key]
        all_ns |= set(int(n) for n in ns)
        mech, mode, causal, threads = key
        colour, marker = styles[mech]
        fmt = dict(marker=marker, color=colour, linestyle=linestyle.get(mode, "-"), markersize=5, linewidth=1.4,
                   markeredgecolor="black", markeredgewidth=0.4)
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
        ax_t.loglog(ns, t, label=f"{lab}  (time ~ N^{slope:.2f})", **fmt)
        ax_m.loglog(ns, np.maximum(mem, 1e-3), **fmt)
        bkey = (baseline, mode, causal, threads)
        if baseline and bkey in data:
            bn, bt, _ = data[bkey]
            common = [n for n in ns if n in set(bn)]
            sp = [dict(zip(bn, bt))[n] / dict(zip(ns, t))[n] for n in common]
            ax_s.loglog(common, sp, **fmt)
        rows.append((lab, slope, show(cross.get("vanilla")) if "vanilla" in cross else "-",
                     show(cross.get("flash")) if "flash" in cross else "-"))

    ctx = doc["context"]
    decode = any(k[1] == "decode" for k in data)
    xlabel = "context length N" if decode else "sequence length N"
    points = [b["point"] for b in doc["benchmarks"] if "point" in b]
    shape = ""
    if points:
        p0 = points[0]
        shape = f'B={p0.get("batch")} H={p0.get("heads")} D={p0.get("dhead")}'
    threads = sorted({k[3] for k in data})
    machine = ctx.get("machine_id") or ctx.get("cpu_model", "")
    fig.suptitle(f'{machine}, {"/".join(map(str, threads))} thread(s), {shape}, median of '
                 f'{doc["benchmarks"][0].get("repetitions", "?")} repetitions\n{ctx.get("command", "")}',
                 fontsize=9)
    ax_t.set(xlabel=xlabel, ylabel="median time per new token (ms)" if decode else "median time per call (ms)",
             title="time per call")
    ax_m.set(xlabel=xlabel, ylabel="tracked working memory (MiB)", title="working memory")
    if baseline:
        ax_s.set(xlabel=xlabel, ylabel=f"speed-up over {baseline} (x)",
                 title=f"speed-up over {baseline}" + (f" ({a.baseline} is not in the file)" if baseline != a.baseline else ""))
        ax_s.axhline(1.0, color="grey", linewidth=0.8)
    else:
        ax_s.set(xlabel=xlabel, title="speed-up")
        ax_s.text(0.5, 0.5, f"neither {a.baseline} nor flash is in the file:\nno reference for a speed-up",
                  ha="center", va="center", transform=ax_s.transAxes)
    for ax in (ax_t, ax_m, ax_s):
        ax.grid(True, which="major", alpha=0.3)
        if ax.lines:
            plain_log_axis(ax.xaxis, all_ns)
            plain_log_axis(ax.yaxis)
            ax.tick_params(axis="x", labelrotation=45)
    handles, labels = ax_t.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9, frameon=False,
               title="mechanism mode (dashed: fwd+bwd)" if any(k[1] == "fwdbwd" for k in data) else "mechanism")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
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
    try:
        main()
    except SystemExit as refusal:
        # Every refusal above is SystemExit("one line naming the problem"), which Python would end with
        # status 1; bad input ends with 2, as argparse's own errors and attnbench's do.
        if isinstance(refusal.code, str):
            print(refusal.code, file=sys.stderr)
            sys.exit(2)
        raise
