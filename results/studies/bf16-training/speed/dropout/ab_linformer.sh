#!/bin/bash
# alternated: new bf16, old bf16, new f32; ListOps preset model with dropout 0.1, attention dropout 0.1
for i in 1 2 3; do
 for mech in linformer; do
  for v in new:bf16 old:bf16 new:f32; do
   bin=${v%%:*}; dt=${v##*:}
   taskset -c 0 ./$bin train --task listops --attn $mech --param k=256 --layers 2 --dmodel 64 --mlp 128 --batch 32 --heads 2 --steps 10 --dropout 0.1 --attn-dropout 0.1 --dtype $dt --eval-every 0 --eval-examples 32 --test-examples 32 --threads 1 --format json > r.json 2>/dev/null
   /usr/bin/python3 -c "
import json,sys
b=json.load(open('r.json'))['benchmarks'][0]
print('$i $mech $bin $dt', round(b['real_time'],1), b.get('note','')[-40:])" >> ab.txt
  done
 done
done
