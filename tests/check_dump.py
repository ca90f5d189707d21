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


def kernel_attention(fq, fk, v, causal):
    """O_i = sum_j (fq_i . fk_j) v_j / (sum_j fq_i . fk_j + 1e-6), j <= i when causal."""
    w = np.einsum("bhif,bhjf->bhij", fq, fk)
    if causal:
        w = np.tril(w)
    return np.einsum("bhij,bhjd->bhid", w, v) / (w.sum(-1, keepdims=True) + 1e-6)


def favor(q, k, v, omega, causal):
    d = q.shape[-1]
    m = omega.shape[0]
    def exponent(x):
        xs = x * d ** -0.25
        return np.einsum("bhnd,fd->bhnf", xs, omega) - (xs ** 2).sum(-1, keepdims=True) / 2
    uq, uk = exponent(q), exponent(k)
    fq = np.exp(uq - uq.max(-1, keepdims=True)) / np.sqrt(m)
    kmax = uk.max(-1)  # (B, H, N)
    if not causal:
        fk = np.exp(uk - kmax.max(-1)[..., None, None]) / np.sqrt(m)
        return kernel_attention(fq, fk, v, False)
    # Causal: query i's keys share the prefix maximum over j <= i.
    out = np.zeros_like(q)
    prefix = np.maximum.accumulate(kmax, axis=-1)
    for i in range(q.shape[2]):
        fk = np.exp(uk[:, :, : i + 1] - prefix[:, :, i][..., None, None]) / np.sqrt(m)
        w = np.einsum("bhf,bhjf->bhj", fq[:, :, i], fk)
        out[:, :, i] = np.einsum("bhj,bhjd->bhd", w, v[:, :, : i + 1]) / (w.sum(-1)[..., None] + 1e-6)
    return out


def expected_output(mech, t, causal):
    if mech in ("vanilla", "flash"):
        return softmax_attention(t["q"], t["k"], t["v"], causal)[1]
    if mech == "linear":
        elu1 = lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
        return kernel_attention(elu1(t["q"]), elu1(t["k"]), t["v"], causal)
    if mech == "performer":
        return favor(t["q"], t["k"], t["v"], t["omega"], causal)
    raise ValueError(mech)


def check(exe, work, mech, causal):
    out = os.path.join(work, f"{mech}_{int(causal)}")
    cmd = [exe, "dump", "--attn", mech, "--batch", "2", "--heads", "3", "--seq", "37",
           "--dhead", "8", "--seed", "5", "--out", out] + (["--causal"] if causal else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["mechanism"] == mech and cfg["causal"] == causal and cfg["seed"] == 5, cfg
    shape = (cfg["B"], cfg["H"], cfg["N"], cfg["D"])
    assert shape == (2, 3, 37, 8), shape
    declared = {"omega": (cfg["params"].get("features", 0), shape[3])}
    t = {}
    for name, file in cfg["tensors"].items():
        arr = np.load(os.path.join(out, file))
        assert arr.dtype == np.float32, (name, arr.dtype)
        assert arr.shape == declared.get(name, shape), (name, arr.shape)
        t[name] = arr.astype(np.float64)
    want = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"} | ({"omega"} if mech == "performer" else set())
    assert set(t) == want, set(t)
    np.testing.assert_allclose(t["out"], expected_output(mech, t, causal), rtol=1e-4, atol=1e-5)
    if mech not in ("vanilla", "flash"):
        return  # kernel gradients are checked against finite differences in the C++ tests
    dq, dk, dv = grads(t["q"], t["k"], t["v"], t["dout"], causal)
    for name, want in (("dq", dq), ("dk", dk), ("dv", dv)):
        np.testing.assert_allclose(t[name], want, rtol=1e-3, atol=1e-4, err_msg=name)


def main():
    exe, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    passed = failed = 0
    for mech in ("vanilla", "flash", "linear", "performer"):
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
