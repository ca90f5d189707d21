#!/usr/bin/python3
"""Peer rows: what a user would otherwise run, on the suite's grid, in the suite's result format.

PyTorch (Debian's python3-torch, an optional dependency) computes attention the naive way a model
written in it does: S = s Q K^T (+ the causal mask), P = softmax(S), O = P V, and the backward by
autograd. Each point runs in its own process (like `attnbench sweep`), once with glibc's default
allocator and once with a tuned one (glibc.malloc tunables that keep freed memory for reuse
instead of returning it to the kernel, so a call does not page-fault its score matrix in again).
Points are named attn:torch-naive/allocator:default|tuned/..., so `attnbench table` and
`scripts/plot.py` show them beside the suite's mechanisms, and `attnbench merge` joins them with a
sweep of the same machine. FLOPs are the suite's own count for the same point (taken from
`attnbench run --attn vanilla`), so GFLOP/s compare like for like. The context records the torch
version, its threads, the BLAS library and OpenBLAS's kernel choice, and the allocator settings.

usage: scripts/peers.py --out FILE [--attnbench build/attnbench] [--seq 256:4096:x2]
           [--mode fwd,fwdbwd] [--batch 1] [--heads 8] [--dhead 64] [--causal 0,1]
           [--threads 1] [--allocator default,tuned] [--reps 5] [--min-time 0.05] [--force]
"""
import argparse
import ctypes
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

# The tuned allocator: no mmap for large blocks (they are reused from the heap instead of being
# mapped and faulted in on every call), and no trimming of the heap's top.
TUNED_MALLOC = "glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=18446744073709551615"
ALLOCATORS = {"default": "", "tuned": TUNED_MALLOC}
MECHANISM = "torch-naive"


def die(msg):
    print(f"peers.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_ints(text, what):
    """'256,512' or '256:4096:x2' (start:end:xFACTOR or start:end:+STEP), as attnbench reads them."""
    out = []
    for part in text.split(","):
        try:
            if ":" in part:
                a, b, step = part.split(":")
                a, b = int(a), int(b)
                v = a
                while v <= b:
                    out.append(v)
                    v = v * int(step[1:]) if step.startswith("x") else v + int(step.lstrip("+"))
                    if len(out) > 10000:
                        raise ValueError
            else:
                out.append(int(part))
        except ValueError:
            die(f"{what} '{text}' is not a list of integers or a range a:b:xK / a:b:+K")
    if not out:
        die(f"{what} '{text}' holds no value (a range a:b needs a <= b)")
    if min(out) < 1:
        die(f"{what} '{text}' needs values >= 1")
    return out


# ---------------------------------------------------------------- the child: one point
def attention(q, k, v, causal, torch):
    # (B, H, N, D) -> (B, H, N, D); the way a PyTorch model writes it.
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def run_child(spec):
    import torch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    B, H, N, D = spec["batch"], spec["heads"], spec["seq"], spec["dhead"]
    backward = spec["mode"] == "fwdbwd"
    q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
    dout = torch.randn(B, H, N, D)
    if backward:
        for t in (q, k, v):
            t.requires_grad_(True)

    def call():
        if backward:
            for t in (q, k, v):
                t.grad = None
            attention(q, k, v, spec["causal"], torch).backward(dout)
        else:
            with torch.no_grad():
                attention(q, k, v, spec["causal"], torch)

    # Warm-up to the steady state: at least --warmup calls, then until the last three calls agree
    # within 15% (at most 30 calls or 20 s). With glibc's default allocator the first calls of a
    # shape run up to 10x slower for about a second (fresh mmapped buffers faulted in on every
    # call, until the allocator's dynamic mmap threshold has grown past them); buffers above its
    # 32 MiB ceiling stay mmapped, so at long N the slow state is the steady one.
    t_start, last, calls = time.perf_counter(), [], 0
    while True:
        t0 = time.perf_counter()
        call()
        calls += 1
        last = (last + [time.perf_counter() - t0])[-3:]
        settled = calls >= max(3, spec["warmup"]) and max(last) <= 1.15 * min(last)
        if settled or (calls >= spec["warmup"] and (calls >= 30 or time.perf_counter() - t_start > 20)):
            break
    # Calls per repetition: grown until one round lasts --min-time (the warm-up is no guide).
    iterations = 1
    for _ in range(8):
        t0 = time.perf_counter()
        for _ in range(iterations):
            call()
        took = time.perf_counter() - t0
        if took >= spec["min_time"]:
            break
        iterations = math.ceil(iterations * max(1.1, min(10.0, 1.2 * spec["min_time"] / max(took, 1e-9))))
    reps = []
    for _ in range(spec["reps"]):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(iterations):
            call()
        w1, c1 = time.perf_counter(), time.process_time()
        reps.append({"real_s": (w1 - w0) / iterations, "cpu_s": (c1 - c0) / iterations, "iterations": iterations})
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    print(json.dumps({"reps": reps, "peak_rss_bytes": peak_rss, "minor_faults": faults}))


# ---------------------------------------------------------------- the parent
def blas_info():
    """The BLAS torch's matmul goes to (Debian's torch links libblas.so.3, whichever the
    alternatives point to) and, for OpenBLAS, its kernel choice and build."""
    info = {}
    try:
        path = os.path.realpath("/etc/alternatives/libblas.so.3-x86_64-linux-gnu")
        info["blas_library"] = path
    except OSError:
        pass
    try:
        lib = ctypes.CDLL("libblas.so.3")
        for name, key in (("openblas_get_corename", "openblas_corename"), ("openblas_get_config", "openblas_config")):
            if hasattr(lib, name):
                fn = getattr(lib, name)
                fn.restype = ctypes.c_char_p
                info[key] = fn().decode()
    except OSError:
        pass
    if "openblas_corename" not in info:
        info["blas_warning"] = "not OpenBLAS: torch's matmul runs the reference BLAS here (apt-get install libopenblas0-openmp)"
    return info


def suite_point(exe, p):
    """The suite's vanilla at the same point: its FLOPs, and the run's context (machine id, CPU,
    the GEMM reference), so the file merges and compares with the suite's own."""
    cmd = [exe, "run", "--attn", "vanilla", "--mode", p["mode"], "--batch", str(p["batch"]), "--heads", str(p["heads"]),
           "--seq", str(p["seq"]), "--dhead", str(p["dhead"]), "--threads", str(p["threads"]), "--reps", "1",
           "--min-time", "0", "--warmup", "0", "--format", "json"]
    if p["causal"]:
        cmd.append("--causal")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"attnbench refused the point: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    doc = json.loads(r.stdout)
    first = next(b for b in doc["benchmarks"] if b.get("run_type") == "iteration")
    return first, doc["context"]


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the result file to write")
    ap.add_argument("--attnbench", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "attnbench"))
    ap.add_argument("--seq", default="256:4096:x2")
    ap.add_argument("--mode", default="fwd,fwdbwd")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--heads", default="8")
    ap.add_argument("--dhead", default="64")
    ap.add_argument("--causal", default="0", help="0, 1 or 0,1")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--allocator", default="default,tuned")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="overwrite --out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        run_child(json.loads(a.child))
        return 0

    try:
        import torch  # noqa: F401  (only to say early that it is missing)
    except ImportError:
        die("PyTorch is not installed (Debian: apt-get install python3-torch); run with /usr/bin/python3")
    if os.path.exists(a.out) and not a.force:
        die(f"{a.out} exists; give another --out or --force")
    if not os.access(a.attnbench, os.X_OK):
        die(f"--attnbench {a.attnbench} is not an executable (build it: scripts/build.sh)")
    if a.reps < 1 or not (a.min_time >= 0 and math.isfinite(a.min_time)) or a.warmup < 0:
        die("--reps must be >= 1, --min-time a finite number >= 0, --warmup >= 0")
    modes = a.mode.split(",")
    for m in modes:
        if m not in ("fwd", "fwdbwd"):
            die(f"--mode {m}: torch-naive runs fwd and fwdbwd")
    allocators = a.allocator.split(",")
    for al in allocators:
        if al not in ALLOCATORS:
            die(f"--allocator {al}: one of {', '.join(ALLOCATORS)}")
    causals = []
    for c in a.causal.split(","):
        if c not in ("0", "1"):
            die(f"--causal {c}: 0 or 1")
        causals.append(c == "1")

    grid = []
    for mode in modes:
        for causal in causals:
            for batch in parse_ints(a.batch, "--batch"):
                for heads in parse_ints(a.heads, "--heads"):
                    for dhead in parse_ints(a.dhead, "--dhead"):
                        for threads in parse_ints(a.threads, "--threads"):
                            for seq in parse_ints(a.seq, "--seq"):
                                grid.append(dict(mode=mode, causal=causal, batch=batch, heads=heads, dhead=dhead,
                                                 threads=threads, seq=seq))
    import torch

    benchmarks, context = [], None
    command = " ".join([sys.argv[0]] + sys.argv[1:])
    for p in grid:
        suite, ctx = suite_point(a.attnbench, p)
        if context is None:
            context = dict(ctx)
        if "gemm_gflops_per_s_on_threads" in ctx:  # each point's own run measured its thread count
            context.setdefault("gemm_gflops_per_s_on_threads", {}).update(ctx["gemm_gflops_per_s_on_threads"])
        # GEMM on as many threads as the point (the suite measures each thread count it runs).
        gemm = context.get("gemm_gflops_per_s_on_threads", {}).get(str(p["threads"]),
                                                                   context.get("gemm_gflops_per_s_1thread", 0) * p["threads"])

        def of_gemm(seconds):
            return {"peak_fraction": suite["flops"] / seconds * 1e-9 / gemm} if gemm > 0 else {}
        for al in allocators:
            env = dict(os.environ)
            env["OMP_NUM_THREADS"] = str(p["threads"])
            if ALLOCATORS[al]:
                env["GLIBC_TUNABLES"] = ALLOCATORS[al]
            spec = dict(p, reps=a.reps, min_time=a.min_time, warmup=a.warmup, seed=a.seed)
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--out", a.out, "--child", json.dumps(spec)],
                               capture_output=True, text=True, env=env)
            point = dict(suite["point"])
            point["attn"] = MECHANISM
            point["params"] = {"allocator": al}
            name = suite["name"].replace("attn:vanilla/", f"attn:{MECHANISM}/allocator:{al}/", 1)
            label = f"{command} (this point: --seq {p['seq']} --mode {p['mode']} --allocator {al})"
            base = {"name": name, "run_name": name, "family_index": 0, "per_family_instance_index": 0,
                    "threads": p["threads"], "time_unit": "ms", "label": label, "point": point,
                    "flops": suite["flops"], "repetitions": a.reps}
            if r.returncode != 0:
                last = (r.stderr.strip().splitlines() or ["?"])[-1]
                status = "OOM" if r.returncode == -9 else "CRASHED" if r.returncode < 0 else "FAILED"
                benchmarks.append(dict(base, run_type="iteration", repetition_index=0, iterations=0, real_time=0,
                                       cpu_time=0, error_occurred=True,
                                       error_message=f"{status}: exit {r.returncode}: {last}"))
                print(f"{name}: {status}: {last}", file=sys.stderr)
                continue
            out = json.loads(r.stdout.strip().splitlines()[-1])
            times = []
            for i, rep in enumerate(out["reps"]):
                ms = rep["real_s"] * 1e3
                times.append(ms)
                benchmarks.append(dict(base, run_type="iteration", repetition_index=i, iterations=rep["iterations"],
                                       real_time=ms, cpu_time=rep["cpu_s"] * 1e3,
                                       gflops_per_s=suite["flops"] / rep["real_s"] * 1e-9, **of_gemm(rep["real_s"]),
                                       peak_rss_bytes=float(out["peak_rss_bytes"]),
                                       minor_faults=out["minor_faults"],
                                       tokens_per_s=p["batch"] * p["seq"] / rep["real_s"]))
            med = median(times)
            benchmarks.append(dict(base, run_type="aggregate", aggregate_name="median", aggregate_unit="time",
                                   iterations=a.reps, real_time=med,
                                   cpu_time=median([r_["cpu_s"] * 1e3 for r_ in out["reps"]]),
                                   gflops_per_s=suite["flops"] / (med * 1e-3) * 1e-9, **of_gemm(med * 1e-3),
                                   peak_rss_bytes=float(out["peak_rss_bytes"])))
            print(f"{name} {med:.4g} ms", file=sys.stderr)

    context.update({
        "command": command,
        "executable": "scripts/peers.py",
        "peer": "PyTorch naive attention (matmul, softmax, matmul; autograd backward), each point in its own process",
        "torch_version": torch.__version__,
        "torch_threads": "as the point's threads (torch.set_num_threads, OMP_NUM_THREADS)",
        "python_version": sys.version.split()[0],
        "allocators": {k: (v or "glibc malloc defaults") for k, v in ALLOCATORS.items() if k in allocators},
        "flops_from": "the suite's count for attn:vanilla at the same point",
    })
    context.update(blas_info())
    for k in ("warnings", "gemm_other_runnable", "load_avg"):
        context.pop(k, None)
    doc = {"context": context, "benchmarks": benchmarks}
    d = os.path.dirname(os.path.abspath(a.out))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".peers-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, a.out)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"peers.py: {len(grid) * len(allocators)} points in {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
