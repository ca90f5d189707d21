#!/bin/bash
# Induction calibration: the N 64 recipe at N 128 and 256.
cd /work/main/runs/ind64
while pgrep -f "calib.sh" > /dev/null; do sleep 10; done
for spec in "128 rope 20000" "128 learned 20000" "256 rope 10000"; do
  set -- $spec
  taskset -c 0 nice -n 5 ../attnbench-ind train --attn flash --task induction --seq $1 --layers 2 --dmodel 64 --heads 4 --mlp 128 --causal \
    --batch 32 --steps $3 --lr 1e-3 --schedule cosine --warmup-steps 500 --weight-decay 0.1 --clip 1 --dropout 0 --positions $2 \
    --eval-every 500 --eval-examples 500 --test-examples 500 --stop-at 0.99 --seed 1 \
    --checkpoint ck-$2-n$1 --checkpoint-every 500 --resume --log $2-n$1.jsonl --out calib-n.json
done
