#!/bin/bash
# Induction calibration at N 64: batch 32, cosine with warm-up, 20,000 steps.
cd /work/main/runs/ind64
for lr in 1e-3 3e-3; do
for pos in rope learned; do
  taskset -c 0 nice -n 5 ../attnbench-ind train --attn flash --task induction --seq 64 --layers 2 --dmodel 64 --heads 4 --mlp 128 --causal \
    --batch 32 --steps 20000 --lr $lr --schedule cosine --warmup-steps 500 --weight-decay 0.1 --clip 1 --dropout 0 --positions $pos \
    --eval-every 1000 --eval-examples 500 --test-examples 500 --stop-at 0.99 --seed 1 --test-seq 128,256,512,1024 \
    --checkpoint ck-$pos-$lr --checkpoint-every 1000 --resume --log $pos-$lr.jsonl --out calib.json
done; done
