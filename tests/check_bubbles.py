"""scripts/plot.py bubbles --speed: the speed and memory of each (task, mechanism) come from the
timed steps of a `run --preset lra-accuracy` file (their medians), not from the training runs'
wall clock; a training run without a timed step is refused, naming it. The title names the timed
steps' machine and every machine that finished training runs of the file, not only the first.
The reference of speed and memory is the requested one (vanilla) only when it finished as many
tasks as flash; otherwise every bubble would average over the reference's few tasks.
A refusal on the command line is one line on stderr and exit status 2.

usage: /usr/bin/python3 tests/check_bubbles.py
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("plot", os.path.join(root, "scripts", "plot.py"))
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)
plot.matplotlib.rcParams["svg.fonttype"] = "none"  # axis labels as <text>
plot.mechanism_families = lambda exe: {}  # no attnbench binary needed for the colours


def point(mech, task, training):
    p = {"attn": mech, "level": "model", "mode": "train", "task": task, "seq": 128}
    if training:
        p["steps"] = 100
    return p


def write(path, benchmarks, context=None):
    with open(path, "w") as f:
        json.dump({"context": context or {"machine_id": "test"}, "benchmarks": benchmarks}, f)


with tempfile.TemporaryDirectory() as work:
    trained, timed = os.path.join(work, "trained.json"), os.path.join(work, "timed.json")
    # Training runs: wall-clock speeds of a shared core (0.1 steps/s for both).
    write(trained, [{"name": m, "point": point(m, "listops", True), "accuracy": acc, "steps_per_s": 0.1,
                     "peak_bytes": 1e8} for m, acc in (("flash", 0.36), ("linear", 0.35))],
          # a grid begun on machine A, resumed on B (which finished a run) and C (which did not),
          # merged with a shard of machine D
          {"machine_id": "machine-A", "command": "attnbench merge",
           "resumed_by": ["an old resumption without its machine",
                          {"machine_id": "machine-B", "points": ["linear"]},
                          {"machine_id": "machine-C", "points": []}],
           "merged_from": [{"machine_id": "machine-A", "resumed_by": []},
                           {"machine_id": "machine-D", "resumed_by": []}]})
    # Timed steps: flash 500 ms (2 steps/s), linear 100 ms (10 steps/s); a repetition is not the median.
    write(timed, [{"name": "flash", "point": point("flash", "listops", False), "aggregate_name": "median",
                   "real_time": 500.0, "time_unit": "ms", "peak_bytes": 4e8},
                  {"name": "flash", "point": point("flash", "listops", False), "real_time": 900.0, "time_unit": "ms",
                   "peak_bytes": 4e8},
                  {"name": "linear", "point": point("linear", "listops", False), "aggregate_name": "median",
                   "real_time": 100.0, "time_unit": "ms", "peak_bytes": 1e8}],
          {"machine_id": "timing-machine", "command": "attnbench run --preset lra-accuracy"})
    steps = plot.load_timed_steps(timed)
    if steps != {("listops", "flash"): (2.0, 4e8), ("listops", "linear"): (10.0, 1e8)}:
        sys.exit(f"FAIL: timed steps read as {steps}")
    prefix = os.path.join(work, "bubbles")
    plot.bubbles_main([trained, prefix, "--speed", timed, "--baseline", "flash"])
    with open(prefix + ".svg") as f:
        svg = f.read()
    if "timed steps, timed.json" not in svg:
        sys.exit("FAIL: the chart does not say its speeds are timed steps")
    title = plot.plt.gcf()._suptitle.get_text()
    for part in ("speed and memory: timing-machine, attnbench run --preset lra-accuracy",
                 "runs on machine-A, machine-B, machine-D"):
        if part not in title:
            sys.exit(f"FAIL: the title {title!r} does not say {part!r}")
    # The overview's bubbles sit at the timed ratio: flash 1x, linear 5x (the wall clock says 1x).
    xs = sorted(float(c.get_offsets()[0][0]) for c in plot.plt.gcf().axes[0].collections)
    if [round(x, 9) for x in xs] != [1.0, 5.0]:
        sys.exit(f"FAIL: the overview's speeds are {xs}, not the timed 1x and 5x")
    # The default reference, vanilla, finished one task where flash finished two: the reference is
    # flash, so linear's bubble averages both tasks (35% and 75%: 55%), not listops alone.
    write(trained, [{"name": m, "point": point(m, t, True), "accuracy": acc, "steps_per_s": 0.1,
                     "peak_bytes": 1e8}
                    for m, t, acc in (("vanilla", "listops", 0.36), ("flash", "listops", 0.36),
                                      ("flash", "image", 0.76), ("linear", "listops", 0.35),
                                      ("linear", "image", 0.75))])
    write(timed, [{"name": m, "point": point(m, t, False), "aggregate_name": "median", "real_time": ms,
                   "time_unit": "ms", "peak_bytes": 4e8}
                  for m, ms in (("vanilla", 600.0), ("flash", 500.0), ("linear", 100.0))
                  for t in ("listops", "image")])
    plot.bubbles_main([trained, prefix, "--speed", timed])
    ys = {round(float(c.get_offsets()[0][0]), 9): round(float(c.get_offsets()[0][1]), 9)
          for c in plot.plt.gcf().axes[0].collections}
    if ys.get(5.0) != 55.0 or ys.get(1.0) != 56.0:
        sys.exit(f"FAIL: with vanilla on one task of two, the overview's (speed, accuracy) are {ys}, "
                 "not flash's (1x, 56%) and linear's (5x, 55%)")
    write(timed, [{"name": "flash", "point": point("flash", "listops", False), "aggregate_name": "median",
                   "real_time": 500.0, "time_unit": "ms", "peak_bytes": 4e8}])
    try:
        plot.bubbles_main([trained, prefix, "--speed", timed])
        sys.exit("FAIL: a training run without a timed step was plotted")
    except SystemExit as e:
        if "no timed step of" not in str(e) or "linear on listops" not in str(e):
            sys.exit(f"FAIL: unexpected refusal: {e}")
# A log axis spanning less than a decade gets linear ticks (1.5, 2, 2.5, ...): each keeps its own
# label, not "2 2 2" rounded to integers.
fig, ax = plot.plt.subplots()
ax.set_xscale("log")
ax.set_xlim(1.4, 4.6)
plot.plain_log_axis(ax.xaxis)
fig.canvas.draw()
labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
if len(labels) < 3 or len(set(labels)) != len(labels) or "2.5" not in labels:
    sys.exit(f"FAIL: a log axis from 1.4 to 4.6 is labelled {labels}")
# From the command line a refusal is one line on stderr naming the problem, and status 2.
with tempfile.TemporaryDirectory() as work:
    missing = os.path.join(work, "no-such-result.json")
    run = subprocess.run([sys.executable, os.path.join(root, "scripts", "plot.py"), "bubbles", missing,
                          os.path.join(work, "chart")], capture_output=True, text=True)
    if run.returncode != 2 or "no-such-result.json" not in run.stderr or run.stderr.count("\n") != 1:
        sys.exit(f"FAIL: a missing result file ended with status {run.returncode} and stderr {run.stderr!r}")
print("bubbles: ok")
