"""scripts/plot.py frontier: the best learning rate of a configuration is chosen by its seeds' mean
validation accuracy and drawn at their mean test accuracy, over the grid's file and files of
further seeds (`--also`), as `attnbench table` does; one file alone gives the best single run.

usage: /usr/bin/python3 tests/check_frontier_seeds.py
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


def entry(lr, seed, val, acc):
    point = {"attn": "flash", "params": {}, "dmodel": 64, "seq": 64, "batch": 64, "task": "mqar", "lr": lr, "seed": seed}
    return {"run_type": "iteration", "point": point, "val_accuracy": val, "accuracy": acc, "real_time": 100.0}


def write(path, entries):
    with open(path, "w") as f:
        json.dump({"context": {"command": "test"}, "benchmarks": entries}, f)


with tempfile.TemporaryDirectory() as work:
    grid, more = os.path.join(work, "grid.json"), os.path.join(work, "more.json")
    # Rate 0.01: seeds 0.9 and 0.1 (mean 0.5); rate 0.001: seeds 0.6 and 0.6 (mean 0.6).
    write(grid, [entry("0.01", 1, 0.9, 0.9), entry("0.001", 1, 0.6, 0.7)])
    write(more, [entry("0.01", 2, 0.1, 0.1), entry("0.001", 2, 0.6, 0.5)])
    _, best, _ = plot.recall_runs([grid], 64)
    (acc, _, point), = best.values()
    if (point["lr"], acc) != ("0.01", 0.9):
        sys.exit(f"one file: expected the best single run (lr 0.01, 0.9), got lr {point['lr']}, {acc}")
    _, best, _ = plot.recall_runs([grid, more], 64)
    (acc, _, point), = best.values()
    if point["lr"] != "0.001" or abs(acc - 0.6) > 1e-12:
        sys.exit(f"with further seeds: expected lr 0.001 at the seeds' mean 0.6, got lr {point['lr']}, {acc}")
print("frontier seeds: ok")
