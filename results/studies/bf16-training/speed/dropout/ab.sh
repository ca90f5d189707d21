#!/bin/bash
# Alternated rounds of: new bf16, old bf16, new f32 (binaries ./new and ./old), the ListOps model of
# lra-accuracy with dropout 0.1 and attention dropout 0.1, one thread on core 0; appends to ab.txt.
# usage: ab.sh "MECHANISMS" [EXTRA TRAIN OPTIONS], e.g. ab.sh "local flash"; ab.sh linformer "--param k=256"
mechs=$1
extra=${2:-}
for i in 1 2 3; do
 for mech in $mechs; do
  for v in new:bf16 old:bf16 new:f32; do
   bin=${v%%:*}; dt=${v##*:}
   # shellcheck disable=SC2086
   taskset -c 0 ./$bin train --task listops --attn $mech $extra --layers 2 --dmodel 64 --mlp 128 --batch 32 --heads 2 --steps 10 --dropout 0.1 --attn-dropout 0.1 --dtype $dt --eval-every 0 --eval-examples 32 --test-examples 32 --threads 1 --format json > r.json 2>/dev/null
   /usr/bin/python3 -c "
import json
b = json.load(open('r.json'))['benchmarks'][0]
print('$i $mech $bin $dt', round(b['real_time'], 1), b.get('note', '')[-40:])" >> ab.txt
  done
 done
done
