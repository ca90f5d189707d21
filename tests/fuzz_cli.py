#!/usr/bin/python3
"""Fuzzing the command line and the result-file readers (issue 31).

For every seed in tests/fuzz_seeds.txt, a few random command lines (verbs, options, values drawn
from valid, boundary and hostile pools) and a few malformed result files (edits of a valid one)
are run against the binary in a scratch directory. Each call must:
  - end by itself within its timeout (no hang),
  - exit with a code, not a signal, and without a sanitizer report on stderr,
  - exit 0 or 2 (1 only where the tool documents a runtime failure: none of these inputs is one),
  - and, when it failed, leave no new file in the scratch directory.
A failure prints the seed and the command, so it reproduces: tests/fuzz_cli.py EXE --seed S.

usage: tests/fuzz_cli.py ATTNBENCH_EXE [--seed S] [--calls-per-seed K] [--timeout SECONDS]
"""
import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile

VERBS = ["run", "sweep", "train", "table", "compare", "export", "merge", "dump", "list", "task sample", "task rate"]
MECHS = ["flash", "linear", "local", "bigbird", "reformer", "performer", "all", "nosuch", "", "flash,linear"]
INTS = ["1", "2", "16", "64", "0", "-1", "3.5", "", "x", "9223372036854775807", "9223372036854775808",
        "1:64:x2", "16:64:+16", "64:16:x2", "1:9223372036854775807:x2", "1:100000000:+1", "1e3", "0x10"]
REALS = ["0", "0.01", "-1", "nan", "inf", "1e309", "", "abc"]
WORDS = ["md", "csv", "json", "jsonl", "sql", "latex", "nosuch", "", "-", "fwd", "fwdbwd", "decode", "train",
         "model", "attention", "copy", "listops", "text", "image", "pathfinder", "nosuchtask"]
OPTIONS = {
    "--attn": MECHS, "--seq": INTS, "--batch": INTS, "--heads": INTS, "--dhead": INTS, "--threads": INTS,
    "--reps": INTS, "--min-time": REALS, "--warmup": INTS, "--mem-limit": ["1G", "0.5", "-1", "16M", "x", ""],
    "--mode": WORDS, "--level": WORDS, "--task": WORDS, "--format": WORDS, "--metric": ["time", "memory", "nosuch", ""],
    "--param": ["window=8", "window=-1", "k=0", "nosuch=1", "block=3", "="], "--seed": INTS, "--steps": INTS,
    "--layers": INTS, "--dmodel": INTS, "--mlp": INTS, "--time-limit": REALS, "--filter": ["flash", "(", ".*", ""],
    "--count": INTS, "--first": INTS, "--shard": ["1/2", "0/2", "3/2", "x"], "--lr": REALS,
    "--schedule": ["constant", "onecycle", "step:1:0.1", "step:x", "nosuch"], "--baseline": ["flash", "nosuch", "none"],
}
FLAGS = ["--causal", "--error", "--wide", "--dry-run", "--force", "--resume", "--any-machine", "--nosuchflag"]


def random_command(rng, files):
    verb = rng.choice(VERBS)
    args = verb.split()
    if verb in ("table", "compare", "export", "merge"):
        args += rng.sample(files, k=min(len(files), 2 if verb == "compare" else rng.randint(1, 2)))
    for _ in range(rng.randint(0, 6)):
        if rng.random() < 0.2:
            args.append(rng.choice(FLAGS))
        else:
            opt = rng.choice(list(OPTIONS))
            args += [opt, rng.choice(OPTIONS[opt])]
    # Small shapes, so that a valid command finishes in a moment.
    if verb in ("run", "sweep", "train", "dump") and "--seq" not in args:
        args += ["--seq", "16", "--heads", "1", "--dhead", "4", "--batch", "1"]
    if verb in ("run", "sweep"):
        args += ["--reps", "1", "--min-time", "0", "--mem-limit", "256M"]
    if verb == "train":
        args += ["--steps", "2", "--layers", "1", "--dmodel", "8", "--mlp", "8", "--eval-examples", "4",
                 "--test-examples", "4"]
    if verb in ("run", "sweep", "train", "merge", "export", "dump") and rng.random() < 0.7:
        args += ["--out", rng.choice(["out.json", "out_dir", "-", "existing.json", "."])]
    return args


def malformed(rng, good):
    """A result file: an edit of a valid one, as text."""
    doc = json.loads(json.dumps(good))
    kind = rng.randrange(12)
    entry = doc["benchmarks"][rng.randrange(len(doc["benchmarks"]))]
    key = rng.choice(sorted(entry))
    if kind == 0:
        entry[key] = rng.choice([None, "x", -1, 1e300, [], {}, True])
    elif kind == 1:
        del entry[key]
    elif kind == 2:
        doc["context"] = rng.choice([[], 1, "x", None])
    elif kind == 3:
        doc["benchmarks"] = rng.choice([{}, "x", [1], [None]])
    elif kind == 4:
        doc["benchmarks"].append(json.loads(json.dumps(entry)))
    elif kind == 5:
        text = json.dumps(doc)
        return text[: rng.randrange(len(text))]
    elif kind == 6:
        return "[" * rng.randint(100, 100000)
    elif kind == 7:
        entry["real_time"] = rng.choice([0, -1e-9, 1e308 * 10 if False else 1.7e308])
    elif kind == 8:
        entry["iterations"] = rng.choice([0, -3, 2.5, "7"])
    elif kind == 9:
        doc["context"]["machine_id"] = rng.choice([3, None, ["a"]])
    elif kind == 10:
        entry["run_name"] = rng.choice(["", "attn:nosuch", "x" * 5000])
    else:
        entry["error_occurred"] = rng.choice(["yes", 1, None])
    return json.dumps(doc)


CODES = {}


def run_one(exe, args, cwd, timeout):
    before = set(os.listdir(cwd))
    try:
        p = subprocess.run([exe] + args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "detect_leaks=0")})
    except subprocess.TimeoutExpired:
        return "hang (no exit within %g s)" % timeout
    err = p.stderr
    CODES[p.returncode] = CODES.get(p.returncode, 0) + 1
    if p.returncode < 0:
        return "killed by signal %d: %s" % (-p.returncode, err[-300:])
    if "Sanitizer" in err or "runtime error:" in err:
        return "sanitizer report: " + err[-500:]
    if p.returncode not in (0, 2):
        return "exit %d: %s" % (p.returncode, err[-300:])
    if p.returncode == 2:
        new = set(os.listdir(cwd)) - before
        if new:
            return "a failed command left %s behind" % sorted(new)
        if err.count("\n") > 1 or len(err) > 600:
            return "the error is not one short line: %r" % err[:300]
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("--seed", type=int, help="one seed (default: every seed in tests/fuzz_seeds.txt)")
    ap.add_argument("--seeds", help="a range of seeds FIRST:LAST, to search for new failures")
    ap.add_argument("--calls-per-seed", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()
    exe = os.path.abspath(a.exe)
    here = os.path.dirname(os.path.abspath(__file__))
    if a.seed is not None:
        seeds = [a.seed]
    elif a.seeds:
        first, last = map(int, a.seeds.split(":"))
        seeds = list(range(first, last + 1))
    else:
        with open(os.path.join(here, "fuzz_seeds.txt")) as f:
            seeds = [int(line.split("#")[0]) for line in f if line.split("#")[0].strip()]
    failures = 0
    calls = 0
    with tempfile.TemporaryDirectory(prefix="attnbench_fuzz_") as scratch:
        good_path = os.path.join(scratch, "good.json")
        subprocess.run([exe, "run", "--attn", "flash,linear", "--seq", "16,32", "--heads", "1", "--dhead", "4",
                        "--reps", "2", "--min-time", "0", "--out", good_path], check=True, capture_output=True)
        with open(good_path) as f:
            good = json.load(f)
        for seed in seeds:
            rng = random.Random(seed)
            cwd = os.path.join(scratch, "seed%d" % seed)
            os.makedirs(cwd)
            shutil.copy(good_path, os.path.join(cwd, "existing.json"))
            bad_files = []
            for i in range(2):
                path = os.path.join(cwd, "bad%d.json" % i)
                with open(path, "w") as f:
                    f.write(malformed(rng, good))
                bad_files.append(path)
            files = bad_files + [os.path.join(cwd, "existing.json")]
            # Every malformed file through every reader; then random command lines.
            commands = [["table", p] for p in bad_files] + [["compare", files[-1], p] for p in bad_files]
            commands += [random_command(rng, files) for _ in range(a.calls_per_seed)]
            for args in commands:
                calls += 1
                problem = run_one(exe, args, cwd, a.timeout)
                if problem:
                    failures += 1
                    print("seed %d: attnbench %s\n  %s" % (seed, " ".join(shlex.quote(x) for x in args), problem))
                # A successful command may write files; each call starts from the same set.
                for name in os.listdir(cwd):
                    if name not in ("existing.json", "bad0.json", "bad1.json"):
                        p = os.path.join(cwd, name)
                        shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    print("fuzz_cli: %d calls over %d seeds (exit codes %s), %d failures" % (
        calls, len(seeds), ", ".join("%d: %d" % kv for kv in sorted(CODES.items())), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
