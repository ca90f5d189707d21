"""Checks `attnbench dump` output with NumPy itself: every file loads as .npy with the shape and
dtype config.json declares, and the output and gradients are recomputed from the dumped inputs.

usage: check_dump.py ATTNBENCH_EXE WORKDIR
       check_dump.py --covered   (the mechanisms it checks, one per line)
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np


def softmax_attention(q, k, v, causal, bias=0.0):
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1]) + bias
    if causal:
        n = q.shape[2]
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return p, np.einsum("bhij,bhjd->bhid", p, v)


def grads(q, k, v, dout, causal, t=None, positions=None):
    bias = position_bias(t, positions, causal) if positions else 0.0
    p, o = softmax_attention(q, k, v, causal, bias)
    dv = np.einsum("bhij,bhid->bhjd", p, dout)
    dp = np.einsum("bhid,bhjd->bhij", dout, v)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(q.shape[-1])
    dq = np.einsum("bhij,bhjd->bhid", ds, k)
    if positions and positions["encoding"] == "shaw":  # the logit s q_i . a_r(i,j) depends on q
        dq += np.einsum("bhij,ijd->bhid", ds, t["shaw_keys"][shaw_index(q.shape[2], positions["clip"])])
    return dq, np.einsum("bhij,bhid->bhjd", ds, q), dv


def t5_bucket(offset, bidirectional, buckets, max_distance):
    """T5's bucket of offset j - i (mesh-tensorflow's _relative_position_bucket), in float32."""
    n = -offset
    ret = 0
    if bidirectional:
        buckets //= 2
        ret = np.where(n < 0, buckets, 0)
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    exact = buckets // 2
    with np.errstate(divide="ignore", invalid="ignore"):
        large = exact + (np.log(n.astype(np.float32) / np.float32(exact)) / np.log(np.float32(max_distance) / np.float32(exact))
                         * np.float32(buckets - exact)).astype(np.int64)
    return ret + np.where(n < exact, n, np.minimum(large, buckets - 1))


def shaw_index(n, clip):
    i = np.arange(n)
    return np.clip(i[None, :] - i[:, None], -clip, clip) + clip  # [i, j] -> embedding of j - i


def position_bias(t, positions, causal):
    """The additive encoding of every (i, j), (B or 1, H, N, N), from its definition."""
    q = t["q"]
    _, h, n, d = q.shape
    i = np.arange(n)
    off = i[None, :] - i[:, None]  # j - i
    enc = positions["encoding"]
    if enc == "alibi":
        p = 1 << (h.bit_length() - 1)
        slopes = [2.0 ** (-8.0 * (x + 1) / p) for x in range(p)]
        slopes += [2.0 ** (-8.0 * (x + 1) / (2 * p)) for x in range(0, 2 * p, 2)][: h - p]
        return -np.array(slopes)[None, :, None, None] * np.abs(off)[None, None]
    if enc == "bias":
        b = t5_bucket(off, not causal, positions["buckets"], positions["max_distance"])
        return t["position_bias"][:, b][None]
    if enc == "shaw":
        a = t["shaw_keys"][shaw_index(n, positions["clip"])]  # (N, N, D)
        return np.einsum("bhid,ijd->bhij", q, a) / np.sqrt(d)
    raise ValueError(enc)


def feature_map_attention(fq, fk, v, causal):
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
        return feature_map_attention(fq, fk, v, False)
    # Causal: query i's keys share the prefix maximum over j <= i.
    out = np.zeros_like(q)
    prefix = np.maximum.accumulate(kmax, axis=-1)
    for i in range(q.shape[2]):
        fk = np.exp(uk[:, :, : i + 1] - prefix[:, :, i][..., None, None]) / np.sqrt(m)
        w = np.einsum("bhf,bhjf->bhj", fq[:, :, i], fk)
        out[:, :, i] = np.einsum("bhj,bhjd->bhd", w, v[:, :, : i + 1]) / (w.sum(-1)[..., None] + 1e-6)
    return out


def softmax_rows(a, causal):
    if causal:
        n = a.shape[-1]
        a = np.where(np.tril(np.ones((n, n), dtype=bool)), a, -np.inf)
    a = a - a.max(-1, keepdims=True)
    p = np.exp(a)
    return p / p.sum(-1, keepdims=True)


def compressed(x, w):
    """K'_t = sum_r x[t*stride + r] @ w[h, r], the last window zero-padded."""
    b, h, n, d = x.shape
    stride = w.shape[1]
    t = -(-n // stride)
    pad = np.zeros((b, h, t * stride, d))
    pad[:, :, :n] = x
    win = pad.reshape(b, h, t, stride, d)
    return np.einsum("bhtri,hrio->bhto", win, w)


def synthesized_logits(t, variant, n):
    if variant == "dense":
        hid = np.maximum(np.einsum("bhnd,hde->bhne", t["q"], t["W1"]) + t["b1"][None, :, None, :], 0)
        return np.einsum("bhne,hem->bhnm", hid, t["W2"][:, :, :n]) + t["b2"][None, :, None, :n]
    if variant == "random":
        return np.broadcast_to(t["R"][None], (t["q"].shape[0],) + t["R"].shape)
    return np.broadcast_to(np.einsum("hik,hjk->hij", t["R1"], t["R2"])[None], (t["q"].shape[0],) + t["R1"].shape[:2] + (n,))


def pattern_mask(mech, t, causal, params):
    """The dense (H, N, N) mask of a fixed sparse pattern, from its definition."""
    n = t["q"].shape[2]
    h = t["q"].shape[1]
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    if mech == "sliding":
        m = np.abs(i - j) <= params["window"]
    elif mech in ("dilated", "longformer"):
        dist, dil = np.abs(i - j), params["dilation"]
        m = (dist % dil == 0) & (dist <= params["window"] * dil)
        if mech == "longformer":
            g = params["global"]
            m = m | (i < g) | (j < g)
    elif mech == "etc":  # the first `global` rows are ETC's global tokens
        g = params["global"]
        m = (np.abs(i - j) <= params["radius"]) | (i < g) | (j < g)
    elif mech == "strided":
        l = params["stride"] or int(round(np.sqrt(n)))
        if params["pattern"] == "strided":
            m = (np.abs(i - j) < l) | ((i - j) % l == 0)
        else:
            m = (j // l == i // l) | (j % l >= l - params["summary"])
    elif mech == "local":
        b = params["block"]
        ahead = 0 if causal else params["lookahead"]
        m = (j // b >= i // b - params["lookback"]) & (j // b <= i // b + ahead)
    elif mech == "bigbird":
        b = params["block"]
        nb = n // b
        g = params["global_blocks"]
        g1, g2 = (g + 1) // 2, g // 2
        qb, kb = i // b, j // b
        glob = lambda x: (x < g1) | (x >= nb - g2)
        base = glob(qb) | glob(kb) | (np.abs(qb - kb) <= 1)
        rb = t["random_blocks"].astype(np.int64)
        assert rb.shape == (h, nb, params["random_blocks"]), rb.shape
        masks = []
        for hh in range(h):
            extra = np.zeros((n, n), dtype=bool)
            for q in range(nb):
                for k in rb[hh, q]:
                    if k >= 0:
                        extra[q * b:(q + 1) * b, k * b:(k + 1) * b] = True
            masks.append(base | extra)
        return np.stack(masks)
    else:
        raise ValueError(mech)
    if causal:
        m = m & (j <= i)
    return np.broadcast_to(m, (h, n, n))


def masked_softmax_attention(q, k, v, mask, bias=0.0):
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1]) + bias
    s = np.where(mask[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", p, v)


def logsumexp(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


# Off while a parameter is perturbed: intermediate tensors the dump holds (sinkhorn's P) then
# differ from the recomputation by design.
CHECK_INTERMEDIATES = True


def check_parameter_gradient(mech, t, causal, prm, enc, name, samples):
    """The dumped gradient d<name> against central differences of sum(dout * out), out recomputed
    in float64 from the dumped tensors with <name> perturbed, at `samples` elements spread over it."""
    global CHECK_INTERMEDIATES
    grad = t["d" + name].reshape(-1)
    flat = t[name].reshape(-1)  # a view: perturbing it perturbs t[name]
    eps = 1e-5
    picked = np.unique(np.linspace(0, flat.size - 1, samples).astype(np.int64))
    fd = np.zeros(picked.size)
    CHECK_INTERMEDIATES = False
    try:
        for n, i in enumerate(picked):
            keep = flat[i]
            loss = []
            for sign in (1, -1):
                flat[i] = keep + sign * eps
                loss.append((expected_output(mech, t, causal, prm, enc) * t["dout"]).sum())
            flat[i] = keep
            fd[n] = (loss[0] - loss[1]) / (2 * eps)
    finally:
        CHECK_INTERMEDIATES = True
    np.testing.assert_allclose(grad[picked], fd, rtol=2e-3, atol=1e-4 * max(1.0, np.abs(grad).max()),
                               err_msg="d" + name + " against finite differences")


def sinkhorn(t, prm):
    """Recomputes everything from Q, K, V, W1, W2 (P included, checked against the dump)."""
    q, k, v = t["q"], t["k"], t["v"]
    B, H, N, D = q.shape
    blk = prm["block"]
    nb = N // blk
    blocks = lambda x: x.reshape(B, H, nb, blk, D)
    x = blocks(q).mean(axis=3)
    hd = np.maximum(np.einsum("bhcd,hde->bhce", x, t["W1"]), 0)
    lg = np.einsum("bhce,hef->bhcf", hd, t["W2"]) / prm["temperature"]
    for _ in range(prm["sinkhorn_iters"]):
        lg = lg - logsumexp(lg, 3)
        lg = lg - logsumexp(lg, 2)
    p = np.exp(lg)
    if CHECK_INTERMEDIATES:
        np.testing.assert_allclose(t["P"], p, rtol=1e-4, atol=1e-6, err_msg="P")
    ks = np.einsum("bhce,bhejd->bhcjd", p, blocks(k))
    vs = np.einsum("bhce,bhejd->bhcjd", p, blocks(v))
    kk = np.concatenate([blocks(k), ks], axis=3)
    vv = np.concatenate([blocks(v), vs], axis=3)
    s = np.einsum("bhcid,bhcjd->bhcij", blocks(q), kk) / np.sqrt(D)
    a = np.exp(s - s.max(axis=-1, keepdims=True))
    a /= a.sum(axis=-1, keepdims=True)
    return np.einsum("bhcij,bhcjd->bhcid", a, vv).reshape(B, H, N, D)


def reformer(t, causal, prm, bias=None):
    """Recomputes the buckets from Q and the rotations (checked against the dump, up to float
    near-ties), then the output from the dumped buckets: sort, chunks with look-back, the
    bucket, causal and self rules, and the log-sum-exp combination of rounds. Causal: the chunks
    are cut within each bucket (a position's chunk is its rank among its bucket's positions
    divided by bucket_size), without the wrap, so a query's keys depend on earlier positions only."""
    q, v = t["q"], t["v"]
    B, H, N, D = q.shape
    rot = t["rotations"]  # (n_hashes, H, D, nb/2)
    proj = np.einsum("bhnd,rhdk->bhrnk", q, rot)
    want = np.concatenate([proj, -proj], axis=-1).argmax(-1)
    got = t["buckets"].astype(np.int64)
    top = np.sort(np.concatenate([proj, -proj], axis=-1), axis=-1)
    near_tie = top[..., -1] - top[..., -2] < 1e-5
    assert ((want == got) | near_tie).all(), "buckets"
    bs = prm["bucket_size"]
    nch = N // bs
    key = q / np.linalg.norm(q, axis=-1, keepdims=True)
    out = np.zeros_like(q)
    for b in range(B):
        for h in range(H):
            lses, outs = [], []
            for r in range(got.shape[2]):
                bk = got[b, h, r]
                order = np.argsort(bk, kind="stable")
                rank = np.array([np.sum(bk[:i] == bk[i]) for i in range(N)])
                lse_r, o_r = np.zeros(N), np.zeros((N, D))
                for p in range(N):
                    i, c = order[p], p // bs
                    if causal:
                        ci = rank[i] // bs
                        window = {j for j in range(i + 1) if bk[j] == bk[i]
                                  and (rank[j] // bs == ci or (nch > 1 and rank[j] // bs == ci - 1))}
                    else:
                        window = set(order[c * bs:(c + 1) * bs]) | set(order[((c - 1) % nch) * bs:((c - 1) % nch + 1) * bs])
                    keys = sorted(j for j in window if bk[j] == bk[i] and j != i and (not causal or j <= i)) or [i]
                    sc = key[b, h, keys] @ q[b, h, i] / np.sqrt(D)
                    if bias is not None:  # the position encoding of the original positions
                        sc = sc + bias[min(b, bias.shape[0] - 1), h, i, keys]
                    m = sc.max()
                    lse_r[i] = m + np.log(np.exp(sc - m).sum())
                    o_r[i] = np.exp(sc - lse_r[i]) @ v[b, h, keys]
                lses.append(lse_r)
                outs.append(o_r)
            w = np.exp(np.array(lses) - logsumexp(np.array(lses), 0))
            out[b, h] = np.einsum("rn,rnd->nd", w, np.array(outs))
    return out


def routing(t, causal, prm):
    """Recomputes the routing from Q and the dumped centroids (every position's nearest centroid;
    not causal, each centroid's top-window positions), checked against the dump up to float
    near-ties, then the output from the dumped routing: not causal, each cluster's members attend
    each other; causal, each position the last `window` positions up to itself of its cluster; a
    query skips itself unless it has no other key; a position's clusters combine by their
    log-sum-exp; a position in no cluster outputs zero. Keys are Q_j/||Q_j||."""
    q, v = t["q"], t["v"]
    B, H, N, D = q.shape
    x = q / np.linalg.norm(q, axis=-1, keepdims=True)
    dist = np.einsum("bhnd,hcd->bhnc", x, t["centroids"])
    got = t["assignment"].astype(np.int64)
    chosen = np.take_along_axis(dist, got[..., None], -1)[..., 0]
    assert (chosen >= dist.max(-1) - 1e-5).all(), "assignment"
    k = dist.shape[-1]
    w = prm["window"] or -(-N // k)
    out = np.zeros_like(q)
    for b in range(B):
        for h in range(H):
            tiles = []  # (query, its candidate keys)
            if causal:
                for i in range(N):
                    same = [j for j in range(i + 1) if got[b, h, j] == got[b, h, i]]
                    tiles.append((i, same[-w:]))
            else:
                for c in range(k):
                    m = t["members"][b, h, c].astype(np.int64)
                    assert len(set(m)) == w and (np.diff(m) > 0).all(), "members"
                    outside = np.setdiff1d(np.arange(N), m)
                    if len(outside):
                        assert dist[b, h, m, c].min() >= dist[b, h, outside, c].max() - 1e-5, "members"
                    tiles += [(i, list(m)) for i in m]
            lses, outs = {}, {}
            for i, cand in tiles:
                keys = [j for j in cand if j != i] or [i]
                sc = x[b, h, keys] @ q[b, h, i] / np.sqrt(D)
                m = sc.max()
                lse = m + np.log(np.exp(sc - m).sum())
                lses.setdefault(i, []).append(lse)
                outs.setdefault(i, []).append(np.exp(sc - lse) @ v[b, h, keys])
            for i in lses:
                l = np.array(lses[i])
                out[b, h, i] = np.einsum("r,rd->d", np.exp(l - logsumexp(l, 0)), np.array(outs[i]))
    return out


# The fixed sparse patterns: softmax attention under the dense mask of pattern_mask.
PATTERNS = ("local", "sliding", "dilated", "strided", "longformer", "etc", "bigbird")


def expected_output(mech, t, causal, params, positions=None):
    bias = position_bias(t, positions, causal) if positions else 0.0
    if mech in PATTERNS:
        return masked_softmax_attention(t["q"], t["k"], t["v"], pattern_mask(mech, t, causal, params), bias)
    if mech in ("vanilla", "flash"):
        return softmax_attention(t["q"], t["k"], t["v"], causal, bias)[1]
    if mech == "linear":
        elu1 = lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))
        return feature_map_attention(elu1(t["q"]), elu1(t["k"]), t["v"], causal)
    if mech == "performer":
        return favor(t["q"], t["k"], t["v"], t["omega"], causal)
    scale = 1 / np.sqrt(t["q"].shape[-1])
    if mech == "linformer":
        kp = np.einsum("hkn,bhnd->bhkd", t["E"], t["k"])
        vp = np.einsum("hkn,bhnd->bhkd", t["F"], t["v"])
        p = softmax_rows(np.einsum("bhid,bhkd->bhik", t["q"], kp) * scale, False)
        return np.einsum("bhik,bhkd->bhid", p, vp)
    if mech == "memory_compressed":
        kc, vc = compressed(t["k"], t["Wk"]), compressed(t["v"], t["Wv"])
        p = softmax_rows(np.einsum("bhid,bhtd->bhit", t["q"], kc) * scale, False)
        return np.einsum("bhit,bhtd->bhid", p, vc)
    if mech == "sinkhorn":
        return sinkhorn(t, params)
    if mech == "reformer":
        return reformer(t, causal, params, bias if positions else None)
    if mech == "routing":
        return routing(t, causal, params)
    if mech == "synthesizer":
        a = synthesized_logits(t, params["variant"], t["q"].shape[2])
        return np.einsum("bhij,bhjd->bhid", softmax_rows(a, causal), t["v"])
    if mech in CONVOLUTIONS:
        return softmax_conv(t, mech, causal)[0]
    raise ValueError(mech)


CONVOLUTIONS = ("lightconv", "dynamicconv")


def softmax_conv(t, mech, causal):
    """lightconv / dynamicconv: O_i = sum_t w_{i,t} V_{i-pad+t} with zero padding, w the softmax
    over the K taps of theta_h (lightconv) or of q_i W_h + b_h (dynamicconv); pad K-1 when
    causal, else (K-1)//2. Returns O, dQ, dK, dV for the dumped dO."""
    q, v, dout = t["q"], t["v"], t["dout"]
    B, H, N, D = v.shape
    if mech == "lightconv":
        w = np.broadcast_to(softmax_rows(t["theta"][None, :, None, :], False), (B, H, N, t["theta"].shape[1]))
    else:
        w = softmax_rows(np.einsum("bhnd,hdk->bhnk", q, t["W"]) + t["b"][None, :, None, :], False)
    K = w.shape[-1]
    pad = K - 1 if causal else (K - 1) // 2
    vp = np.pad(v, ((0, 0), (0, 0), (pad, K - 1 - pad), (0, 0)))
    out = sum(w[..., s, None] * vp[:, :, s:s + N] for s in range(K))
    dvp = np.zeros_like(vp)
    for s in range(K):
        dvp[:, :, s:s + N] += w[..., s, None] * dout
    g = np.stack([(dout * vp[:, :, s:s + N]).sum(-1) for s in range(K)], axis=-1)
    dq = np.zeros_like(q)
    if mech == "dynamicconv":
        dl = w * (g - (w * g).sum(-1, keepdims=True))
        dq = np.einsum("bhnk,hdk->bhnd", dl, t["W"])
    return out, dq, np.zeros_like(q), dvp[:, :, pad:pad + N]


def check(exe, work, mech, causal, params=(), n=37, positions=None):
    out = os.path.join(work, f"{mech}_{int(causal)}_{'_'.join(params)}_{positions or ''}".replace("=", "-").replace(":", "-"))
    cmd = [exe, "dump", "--attn", mech, "--batch", "2", "--heads", "3", "--seq", str(n),
           "--dhead", "8", "--seed", "5", "--out", out] + (["--causal"] if causal else [])
    if positions:
        cmd += ["--positions", positions]
    for p in params:
        cmd += ["--param", p]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["mechanism"] == mech and cfg["causal"] == causal and cfg["seed"] == 5, cfg
    shape = (cfg["B"], cfg["H"], cfg["N"], cfg["D"])
    assert shape == (2, 3, n, 8), shape
    B, H, N, D = shape
    prm = cfg["params"]
    k = min(prm.get("k", 0), N)
    stride = prm.get("stride", 0)
    max_len = prm.get("max_len", 0) or N
    declared = {"omega": (prm.get("features", 0), D), "E": (H, k, N), "F": (H, k, N),
                "Wk": (H, stride, D, D), "Wv": (H, stride, D, D), "W1": (H, D, D), "b1": (H, D),
                "W2": (H, D, max_len), "b2": (H, max_len), "R": (H, N, N),
                "R1": (H, N, prm.get("k", 0)), "R2": (H, N, prm.get("k", 0)),
                "theta": (H, prm.get("kernel", 0))}
    if mech == "dynamicconv":
        declared.update({"W": (H, D, prm["kernel"]), "b": (H, prm["kernel"])})
    if mech in CONVOLUTIONS:
        assert "not used" in cfg.get("note", ""), cfg
    if mech == "sinkhorn":
        nb = N // prm["block"]
        declared.update({"W2": (H, D, nb), "P": (B, H, nb, nb)})
    if mech == "reformer":
        nbk = prm["n_buckets"] or max(2, (N // prm["bucket_size"] + 1) // 2 * 2)
        declared.update({"rotations": (prm["n_hashes"], H, D, nbk // 2), "buckets": (B, H, prm["n_hashes"], N)})
        assert "not used" in cfg.get("note", ""), cfg
    if mech == "routing":
        kc = prm["clusters"] or max(1, int(np.floor(np.sqrt(N) + 0.5)))
        declared.update({"centroids": (H, kc, D), "assignment": (B, H, N),
                         "members": (B, H, kc, prm["window"] or -(-N // kc))})
        assert "not used" in cfg.get("note", ""), cfg
    enc = cfg.get("positions")
    assert bool(enc) == bool(positions), cfg
    if enc:
        declared.update({"position_bias": (H, enc["buckets"]), "shaw_keys": (2 * enc["clip"] + 1, D)})
    if "random_blocks" in cfg["tensors"]:
        declared["random_blocks"] = (H, N // prm["block"], prm["random_blocks"])
    own = {"performer": {"omega"}, "linformer": {"E", "F"}, "memory_compressed": {"Wk", "Wv"},
           "bigbird": {"random_blocks"}, "lightconv": {"theta"}, "dynamicconv": {"W", "b"}, "sinkhorn": {"W1", "W2", "P"}, "reformer": {"rotations", "buckets"},
           "routing": {"centroids", "assignment"} | (set() if causal else {"members"}),
           "synthesizer": {"dense": {"W1", "b1", "W2", "b2"}, "random": {"R"},
                           "factorized": {"R1", "R2"}}.get(prm.get("variant"), set())}
    declared.update({"d" + name: dims for name, dims in list(declared.items())})  # a gradient has its tensor's shape
    t = {}
    for name, file in cfg["tensors"].items():
        arr = np.load(os.path.join(out, file))
        want_dtype = np.int64 if name in ("random_blocks", "buckets", "assignment", "members") else np.float32
        assert arr.dtype == want_dtype, (name, arr.dtype)
        assert arr.shape == declared.get(name, shape), (name, arr.shape)
        t[name] = arr.astype(np.float64)
    # The learned tensors: each has its gradient beside it, "d" + its name.
    learned = {"linformer": {"E"} if prm.get("share_kv") else {"E", "F"}, "memory_compressed": {"Wk", "Wv"},
               "sinkhorn": {"W1", "W2"}, "lightconv": {"theta"}, "dynamicconv": {"W", "b"},
               "synthesizer": own["synthesizer"]}.get(mech, set())
    want = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"} | own.get(mech, set())
    if enc:
        learned = learned | {"bias": {"position_bias"}, "shaw": {"shaw_keys"}}.get(enc["encoding"], set())
        want |= {"bias": {"position_bias"}, "shaw": {"shaw_keys"}}.get(enc["encoding"], set())
    want |= {"d" + name for name in learned}
    assert set(t) == want, set(t)
    for name in learned:
        assert t["d" + name].shape == t[name].shape, name
    if mech == "linformer" and prm.get("share_kv"):
        np.testing.assert_array_equal(t["E"], t["F"])
        t["F"] = t["E"]  # one map: a perturbation of E is one of F
    np.testing.assert_allclose(t["out"], expected_output(mech, t, causal, prm, enc), rtol=1e-4, atol=1e-5)
    for name in sorted(learned):
        check_parameter_gradient(mech, t, causal, prm, enc, name, 4 if mech == "reformer" else 8)
    if mech in CONVOLUTIONS:
        dq, dk, dv = softmax_conv(t, mech, causal)[1:]
    elif mech in ("vanilla", "flash"):
        dq, dk, dv = grads(t["q"], t["k"], t["v"], t["dout"], causal, t, enc)
    else:
        return  # other gradients are checked in the C++ tests
    for name, want in (("dq", dq), ("dk", dk), ("dv", dv)):
        np.testing.assert_allclose(t[name], want, rtol=1e-3, atol=1e-4, err_msg=name)


def covered():
    """The mechanisms some case below dumps and checks (for the registry consistency test)."""
    return sorted({case[0] for case in cases()})


def cases():
    out = [(m, c, (), 37) for m in ("vanilla", "flash", "linear", "performer") for c in (False, True)]
    out += [("linformer", False, ("k=16",), 37), ("linformer", False, ("k=16", "share_kv=true"), 37),
            ("memory_compressed", False, ("stride=3",), 37)]
    out += [("sliding", c, ("window=5",), 37) for c in (False, True)]
    out += [("local", c, ("block=8",), 37) for c in (False, True)]
    out += [("dilated", c, ("window=4", "dilation=3"), 37) for c in (False, True)]
    out += [("strided", c, ("pattern=strided", "stride=6"), 37) for c in (False, True)]
    out += [("strided", c, ("pattern=fixed", "stride=8", "summary=2"), 37) for c in (False, True)]
    out += [("strided", False, ("stride=0",), 37)]
    out += [("longformer", False, ("window=3", "dilation=2", "global=4"), 37)]
    out += [("etc", False, ("radius=4", "global=3"), 37), ("etc", False, ("radius=2", "global=5"), 37, "shaw:3")]
    out += [("bigbird", False, ("block=4", "random_blocks=2"), 36)]
    out += [("sinkhorn", False, ("block=8",), 40), ("sinkhorn", False, ("block=4", "temperature=0.05"), 40)]
    out += [("reformer", c, ("bucket_size=8", "n_buckets=4", "n_hashes=3"), 40) for c in (False, True)]
    out += [("routing", c, p, 40) for c in (False, True) for p in ((), ("clusters=5", "window=6"))]
    out += [("synthesizer", c, (f"variant={v}", "max_len=40", "k=4"), 37)
            for v in ("dense", "random", "factorized") for c in (False, True)]
    out += [(m, c, (f"kernel={k}",), 37) for m in CONVOLUTIONS for c in (False, True) for k in (5, 4)]
    # The additive position encodings inside the kernels, recomputed from the dumped tables.
    out += [(m, c, (), 37, e) for m in ("vanilla", "flash") for c in (False, True)
            for e in ("alibi", "bias:8:20", "shaw:3")]
    out += [("sliding", True, ("window=5",), 37, "bias:8:20"), ("strided", False, ("pattern=fixed", "stride=8", "summary=2"), 37, "shaw:3"),
            ("dilated", False, ("window=4", "dilation=3"), 37, "alibi"), ("bigbird", False, ("block=4", "random_blocks=2"), 36, "shaw:3")]
    out += [("reformer", c, ("bucket_size=8", "n_buckets=4", "n_hashes=3"), 40, e) for c in (False, True)
            for e in ("alibi", "bias:8:20", "shaw:3")]
    return out


def main():
    if sys.argv[1:] == ["--covered"]:
        print("\n".join(covered()))
        return
    exe, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    passed = failed = 0
    for mech, causal, params, n, *positions in cases():
        try:
            check(exe, work, mech, causal, params, n, *positions)
            passed += 1
        except Exception as e:  # report every case, then fail
            print(f"FAIL {mech} causal={causal} {params} {positions}: {e!r}")
            failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
