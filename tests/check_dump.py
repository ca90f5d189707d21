"""Checks `attnbench dump` output with NumPy itself: every file loads as .npy with the shape and
dtype config.json declares, and the output and gradients are recomputed from the dumped inputs.

usage: check_dump.py ATTNBENCH_EXE WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np


def softmax_attention(q, k, v, causal):
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return p, np.einsum("bhij,bhjd->bhid", p, v)


def grads(q, k, v, dout, causal):
    p, o = softmax_attention(q, k, v, causal)
    dv = np.einsum("bhij,bhid->bhjd", p, dout)
    dp = np.einsum("bhid,bhjd->bhij", dout, v)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(q.shape[-1])
    return np.einsum("bhij,bhjd->bhid", ds, k), np.einsum("bhij,bhid->bhjd", ds, q), dv


def check(exe, work, mech, causal):
    out = os.path.join(work, f"{mech}_{int(causal)}")
    cmd = [exe, "dump", "--attn", mech, "--batch", "2", "--heads", "3", "--seq", "37",
           "--dhead", "8", "--seed", "5", "--out", out] + (["--causal"] if causal else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["mechanism"] == mech and cfg["causal"] == causal and cfg["seed"] == 5, cfg
    shape = (cfg["B"], cfg["H"], cfg["N"], cfg["D"])
    assert shape == (2, 3, 37, 8), shape
    t = {}
    for name, file in cfg["tensors"].items():
        arr = np.load(os.path.join(out, file))
        assert arr.dtype == np.float32, (name, arr.dtype)
        assert arr.shape == shape, (name, arr.shape)
        t[name] = arr.astype(np.float64)
    assert set(t) == {"q", "k", "v", "out", "dout", "dq", "dk", "dv"}, set(t)
    _, o = softmax_attention(t["q"], t["k"], t["v"], causal)
    np.testing.assert_allclose(t["out"], o, rtol=1e-4, atol=1e-5)
    dq, dk, dv = grads(t["q"], t["k"], t["v"], t["dout"], causal)
    for name, want in (("dq", dq), ("dk", dk), ("dv", dv)):
        np.testing.assert_allclose(t[name], want, rtol=1e-3, atol=1e-4, err_msg=name)


def main():
    exe, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    passed = failed = 0
    for mech in ("vanilla", "flash"):
        for causal in (False, True):
            try:
                check(exe, work, mech, causal)
                passed += 1
            except Exception as e:  # report every case, then fail
                print(f"FAIL {mech} causal={causal}: {e!r}")
                failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
