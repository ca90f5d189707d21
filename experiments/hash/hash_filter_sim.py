#!/usr/bin/python3
"""How many columns an exact low-precision filter of Reformer's hash leaves to recompute.

reformer's bucket is argmax over [x·R ; -x·R] (mechanisms.md). A filter computes x·R in low
precision, bounds each estimate's distance from the fp32 value, and must recompute in fp32
every column whose estimate is within twice that bound of the best one; a row with one such
column is settled by the filter alone. This simulates the bound for Gaussian rows against one
round of standard normal rotations and prints the share of rows by candidate count.

  int8: each row quantised with its own scale to [-127, 127], R with one scale per round (the
        experiment the README describes; the product is u8 x s8 -> s32, exact).
  bf16: x and R rounded to bfloat16 (round to nearest even); the product sums in fp32.

The bound is Cauchy-Schwarz with the measured norms of the rounding errors dx and dr:
|x~·r~ - x·r| <= ||dx||·||r~|| + ||x||·||dr|| (for int8 written in its scaled form), plus
gamma_D·||x||·||r|| for the fp32 dot's own rounding (and for bf16 the same for the product's
fp32 sums). Usage: experiments/hash/hash_filter_sim.py [--rows 8192] [--D 64] [--half 128] [--seed 0]
"""
import argparse

import numpy as np


def bf16(a):
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def shares(estimate, bound):
    """Candidates per row: columns of [e ; -e] within 2·bound of the row's best."""
    both = np.concatenate([estimate, -estimate], axis=1)
    best = both.max(axis=1, keepdims=True)
    return (both >= best - 2.0 * bound[:, None]).sum(axis=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--half", type=int, default=128, help="rotation columns, n_buckets/2")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    x = rng.standard_normal((a.rows, a.D)).astype(np.float32)
    R = rng.standard_normal((a.D, a.half)).astype(np.float32)
    gamma = a.D * 2.0**-24 / (1 - a.D * 2.0**-24)
    x_norm = np.linalg.norm(x.astype(np.float64), axis=1)
    r_norm = np.linalg.norm(R.astype(np.float64), axis=0).max()

    # int8
    s_x = np.abs(x).max(axis=1) / 127.0
    xq = np.clip(np.rint(x / s_x[:, None]), -127, 127)
    s_r = np.abs(R).max() / 127.0
    rq = np.clip(np.rint(R / s_r), -127, 127)
    dx = np.linalg.norm(x - s_x[:, None] * xq, axis=1)
    dr = np.linalg.norm(R - s_r * rq, axis=0).max()
    rq_norm = np.linalg.norm(rq, axis=0).max()
    xq_norm = np.linalg.norm(xq, axis=1)
    est_int8 = (s_x[:, None] * s_r) * (xq @ rq)
    bound_int8 = s_x * xq_norm * dr + s_r * dx * rq_norm + dx * dr + gamma * x_norm * r_norm

    # bf16
    xb, Rb = bf16(x).astype(np.float64), bf16(R).astype(np.float64)
    est_bf16 = xb @ Rb
    dxb = np.linalg.norm(x - xb, axis=1)
    drb = np.linalg.norm(R - Rb, axis=0).max()
    rb_norm = np.linalg.norm(Rb, axis=0).max()
    bound_bf16 = dxb * rb_norm + x_norm * drb + gamma * (np.linalg.norm(xb, axis=1) * rb_norm + x_norm * r_norm)

    print(f"{a.rows} Gaussian rows, D = {a.D}, {a.half} rotation columns, seed {a.seed}")
    print("| filter | mean candidates | one | two | three or more |")
    print("|---|---:|---:|---:|---:|")
    for name, est, bound in (("int8", est_int8, bound_int8), ("bf16", est_bf16, bound_bf16)):
        c = shares(est, bound)
        print(f"| {name} | {c.mean():.2f} | {np.mean(c == 1):.0%} | {np.mean(c == 2):.0%} | {np.mean(c >= 3):.0%} |")


if __name__ == "__main__":
    main()
