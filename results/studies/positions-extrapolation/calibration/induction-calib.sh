#!/bin/bash
# Induction calibration: flash + RoPE at N 256, the Mamba paper's batch of 8 and constant rate 1e-3,
# after the positions-extrapolation MQAR runs have left core 0.
cd /work/main
while pgrep -f "preset positions-extrapolation" > /dev/null; do sleep 30; done
for pos in rope learned; do
  taskset -c 0 nice -n 5 runs/attnbench-calib2 train --attn flash --task induction --seq 256 --layers 2 --dmodel 64 --heads 4 --mlp 128 --causal \
    --batch 8 --steps 40000 --lr 1e-3 --schedule constant --weight-decay 0 --clip 1 --dropout 0 --positions $pos \
    --eval-every 1000 --eval-examples 500 --test-examples 500 --stop-at 0.99 --seed 1 \
    --checkpoint runs/induction-calib/$pos --checkpoint-every 1000 --resume --log runs/induction-calib/$pos.jsonl --out runs/induction-calib/calib.json
done
