"""scripts/plot.py curves: one line per run, named by mechanism, by task when the logs hold
several tasks (the LRA grid: five `flash` runs were five lines with the same name), and by what
differs when a mechanism has several configurations on one task (lra-knobs); the legend is
read back from the SVG, its text kept as text.

usage: /usr/bin/python3 tests/check_curves.py
"""
import importlib.util
import json
import os
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("plot", os.path.join(root, "scripts", "plot.py"))
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)
plot.matplotlib.rcParams["svg.fonttype"] = "none"  # the legend as <text>, not glyph paths


def write_log(path, mechanism, task, config="L:2"):
    point = f"attn:{mechanism}/level:model/mode:train/task:{task}/{config}/seed:1"
    with open(path, "w") as f:
        for step in (10, 20):
            f.write(json.dumps({"point": point, "mechanism": mechanism, "task": task, "seed": 1, "step": step,
                                "elapsed_s": step * 0.5, "loss": 1.0 / step}) + "\n")
        f.write(json.dumps({"point": point, "mechanism": mechanism, "task": task, "seed": 1, "step": 20,
                            "elapsed_s": 10.0, "val_accuracy": 0.5, "val_loss": 0.69}) + "\n")


def legend(logs, prefix):
    plot.curves_main(logs + [prefix])
    with open(prefix + ".svg") as f:
        return f.read()


with tempfile.TemporaryDirectory() as work:
    logs = []
    for mech, task in (("flash", "listops"), ("flash", "text"), ("local", "listops")):
        logs.append(os.path.join(work, f"{mech}-{task}.jsonl"))
        write_log(logs[-1], mech, task)
    svg = legend(logs, os.path.join(work, "several"))
    for label in ("flash listops", "flash text", "local listops"):
        if label not in svg:
            sys.exit(f"FAIL: no legend entry '{label}' for logs of several tasks")
    svg = legend(logs[:1], os.path.join(work, "one"))
    if "flash listops" in svg or "flash" not in svg:
        sys.exit("FAIL: logs of one task should be labelled by mechanism alone")
    # Several configurations of a mechanism on one task are lines named by what differs (as the
    # rows of `attnbench table`), a data directory's '/' not splitting its field.
    data = "data:/usr/share/datasets/fashion-mnist"
    knobs = []
    for i, config in enumerate((f"dmodel:64/{data}/H:2/steps:12000", f"dmodel:128/{data}/H:4/steps:4000")):
        knobs.append(os.path.join(work, f"knob{i}.jsonl"))
        write_log(knobs[-1], "flash", "image", config)
    svg = legend(knobs, os.path.join(work, "knobs"))
    for label in ("flash dmodel=64 H=2 steps=12000", "flash dmodel=128 H=4 steps=4000"):
        if label not in svg:
            sys.exit(f"FAIL: no legend entry '{label}' for two configurations on one task")
    if "fashion" in svg:
        sys.exit("FAIL: a field both configurations share named in the legend")
print("curves: ok")
