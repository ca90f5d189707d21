"""bench/ is built of rooms whose includes go one way: a file in a room includes headers of its own
room and of the rooms before it in ROOMS, never of a later one (bench/cli.cpp and the executables'
main files, at the top, may include any). Exits 1 naming each include that goes the wrong way.

usage: /usr/bin/python3 tests/check_bench_rooms.py
"""
import os
import re
import sys

# Lowest first: terminal text and tables; the point schema; child processes and scratch folders;
# result files and what reads them; running points (measuring, training, sweeping); the command line.
ROOMS = ["text", "points", "process", "results", "engine", "verbs"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
INCLUDE = re.compile(r'#include "bench/([a-z_]+)/[a-z_]+\.hpp"')

wrong = []
found = set()
for room in sorted(os.listdir(BENCH)):
    path = os.path.join(BENCH, room)
    if not os.path.isdir(path):
        continue
    if room not in ROOMS:
        wrong.append(f"bench/{room}/ is not a room of tests/check_bench_rooms.py (add it to ROOMS, in order)")
        continue
    found.add(room)
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name)) as f:
            for line_no, line in enumerate(f, 1):
                m = INCLUDE.search(line)
                if m and m.group(1) in ROOMS and ROOMS.index(m.group(1)) > ROOMS.index(room):
                    wrong.append(f"bench/{room}/{name}:{line_no} includes bench/{m.group(1)}/, a room above {room}")
missing = [r for r in ROOMS if r not in found]
if missing:
    wrong.append(f"rooms missing from bench/: {', '.join(missing)}")
for w in wrong:
    print(w)
if wrong:
    sys.exit(1)
print(f"bench rooms: {len(found)} rooms, includes one way ({' <- '.join(ROOMS)})")
