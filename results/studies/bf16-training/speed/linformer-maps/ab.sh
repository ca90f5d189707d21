#!/bin/bash
for i in 1 2 3; do
 for v in new:bf16 old:bf16 new:f32; do
  bin=${v%%:*}; dt=${v##*:}
  taskset -c 0 ./$bin run --preset lra-accuracy --attn linformer --task listops --threads 1 --dtype $dt --reps 3 --format json > r4.json 2>/dev/null
  /usr/bin/python3 -c "
import json
bs=json.load(open('r4.json'))['benchmarks']
b=[x for x in bs if x.get('run_type','')=='aggregate' and x.get('aggregate_name')=='median'] or bs
print('$i linformer $bin $dt', round(b[0]['real_time'],1), b[0].get('time_unit'), b[0].get('note','')[-50:])" >> ab4.txt
 done
done
