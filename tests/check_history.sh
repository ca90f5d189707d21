#!/usr/bin/env bash
# `attnbench history`: three runs added (one twice: recorded once), every entry stored in the
# export's long schema (the same rows and columns `export` writes), a run made 3x slower on one
# point flagged as the one regression of the page, and the refusals: a --db that is not SQLite,
# a SQLite file whose `results` table is not a history (both left as they were), a page that
# exists without --force, a missing history.
# usage: tests/check_history.sh ATTNBENCH_EXE
set -euo pipefail
exe="$1"
work="$(mktemp -d -t attnbench-history-XXXXXX)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$work"
"$exe" run --attn flash,linear --seq 128,256 --batch 1 --heads 2 --dhead 16 --reps 7 --min-time 0 --threads 1 \
  --out r1.json >/dev/null 2>run.err || fail "run: $(tail -2 run.err)"
# Runs 2 and 3 are run 1 at later commits and dates (so the page's verdicts do not depend on this
# machine's noise): run 2 the same times, run 3 with flash at N 256 three times slower, every
# repetition and aggregate.
/usr/bin/python3 - <<'PY'
import json
d = json.load(open("r1.json"))
for i, (commit, factor) in enumerate((("first00", 1), ("second0", 1), ("slower0", 3))):
    d = json.load(open("r1.json"))
    d["context"]["git_commit"] = commit
    d["context"]["date"] = f"2026-01-01T0{i}:00:00+00:00"
    for b in d["benchmarks"]:
        if b["name"].startswith("attn:flash/") and "/N:256/" in b["name"]:
            for k in ("real_time", "cpu_time"):
                b[k] *= factor
    json.dump(d, open(f"r{i + 1}.json", "w"), indent=1)
PY
out="$("$exe" history add r1.json r2.json --db h.db)"
grep -q "r2.json: added" <<<"$out" || fail "add: $out"
out="$("$exe" history add r2.json r3.json --db h.db)"
grep -q "r2.json: already in h.db" <<<"$out" || fail "a file added twice was not seen: $out"
/usr/bin/python3 - "$exe" <<'PY'
import json, sqlite3, subprocess, sys
exe = sys.argv[1]
db = sqlite3.connect("h.db")
cols = [r[1] for r in db.execute("PRAGMA table_info(results)")]
runs = db.execute("SELECT count(DISTINCT history_run) FROM results").fetchone()[0]
assert runs == 3, f"{runs} runs stored, 3 added"
for f in ("r1.json", "r2.json", "r3.json"):
    rows = [json.loads(l) for l in subprocess.run([exe, "export", f, "--format", "jsonl"], check=True,
                                                  capture_output=True, text=True).stdout.splitlines()]
    got = db.execute("SELECT count(*) FROM results WHERE file = ?", (f,)).fetchone()[0]
    assert got == len(rows), f"{f}: {got} rows stored, export has {len(rows)}"
    missing = {k for r in rows for k in r} - set(cols)
    assert not missing, f"columns of export not in the history: {sorted(missing)[:5]}"
    # A value reads back as export writes it.
    r = rows[0]
    back = db.execute('SELECT "real_time", "point.seq" FROM results WHERE file = ? AND name = ?', (f, r["name"])).fetchone()
    assert back[0] == r["real_time"] and back[1] == r["point.seq"], (back, r["real_time"], r["point.seq"])
print("history: 3 runs, rows and columns as export writes them")
PY
"$exe" history report --db h.db --out page >/dev/null
grep -q "Regressions (1)" page/index.html || fail "not exactly one regression: $(grep -o 'Regressions ([0-9]*)' page/index.html)"
grep -q "flash N=256" page/index.html || fail "the regression is not flash at N 256"
grep -q "<img alt=" page/index.html || fail "no figure: $(grep -o 'class="missing">[^<]*' page/index.html | head -1)"
if "$exe" history report --db h.db --out page >out.txt 2>&1; then fail "an existing page was replaced without --force"; fi
"$exe" history report --db h.db --out page --force >/dev/null || fail "--force did not replace the page"
# Refusals, with the files left as they were.
printf 'not a database\n' >notes.txt
cp notes.txt notes.orig
set +e
"$exe" history add r1.json --db notes.txt >out.txt 2>&1; code=$?
set -e
[ "$code" = 2 ] || fail "a --db that is not SQLite: exit $code: $(cat out.txt)"
cmp -s notes.txt notes.orig || fail "the file that is not a database was changed"
/usr/bin/python3 -c "import sqlite3; c = sqlite3.connect('other.db'); c.execute('CREATE TABLE results (x)'); c.commit()"
cp other.db other.orig
set +e
"$exe" history add r1.json --db other.db >out.txt 2>&1; code=$?
set -e
[ "$code" = 2 ] && grep -q "not an attnbench history" out.txt || fail "a foreign results table: exit $code: $(cat out.txt)"
cmp -s other.db other.orig || fail "the foreign database was changed"
set +e
"$exe" history report --db missing.db --out page2 >out.txt 2>&1; code=$?
set -e
[ "$code" = 2 ] && grep -q "no such file" out.txt || fail "a missing history: exit $code: $(cat out.txt)"
[ ! -e missing.db ] || fail "report made the missing history"
echo "history: ok"
