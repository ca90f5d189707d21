#!/usr/bin/env bash
# `attnbench report` in a real browser: headless Chromium (Debian's `chromium`) opens the page
# from disk with no network, and the test reads what it rendered: the DOM after the page's script
# ran (every table there, every image decoded, a table sorted both ways by a click on its head),
# the console (no error) and a screenshot (its size, and pixels that are not blank). Also: the
# page has no address outside itself, and a second report into the same directory is refused
# without --force. Exit 77 (skipped) without chromium (scripts/setup.sh --tests installs it).
# usage: tests/check_report.sh ATTNBENCH_EXE SOURCE_DIR
set -euo pipefail
exe="$1"
root="$2"
browser="$(command -v chromium || true)"
if [ -z "$browser" ]; then
  echo "SKIP: no chromium (scripts/setup.sh --tests installs Debian's chromium)"
  exit 77
fi
work="$(mktemp -d -t attnbench-report-XXXXXX)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$exe" run --attn flash,linear,local --seq 128,256 --batch 1 --heads 2 --dhead 16 --reps 3 --min-time 0 --threads 1 \
  --error --out "$work/timed.json" >/dev/null 2>"$work/run.err" || fail "run: $(tail -2 "$work/run.err")"
# A timed file (tables and a plot), a training file of LRA tasks (the accuracy table and LRA's
# layout with the published rows) and an extra image.
"$exe" report "$work/timed.json" "$root/results/studies/lra-accuracy/lra-accuracy.json" \
  --image "$root/results/studies/copy/copy_curves.png" --title "report <test> & check" --out "$work/report" >/dev/null
page="$work/report/index.html"
[ -s "$page" ] || fail "no page"
grep -q 'report &lt;test&gt; &amp; check' "$page" || fail "the title is not escaped"
! grep -Eq '(src|href)="(https?:)?//' "$page" || fail "the page refers to an address outside itself"
grep -q 'class="missing"' "$page" && fail "a section did not draw: $(grep -o 'class="missing">[^<]*' "$page" | head -3)"
if "$exe" report "$work/timed.json" --out "$work/report" >"$work/again.out" 2>&1; then fail "an existing page was replaced without --force"; fi
grep -q "exists" "$work/again.out" || fail "the refusal does not say why: $(cat "$work/again.out")"

run_browser() {  # run_browser OUTPUT_FLAGS... : headless, its own profile, no network
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions \
    --user-data-dir="$work/profile" --proxy-server=127.0.0.1:9 --enable-logging=stderr --v=0 \
    --virtual-time-budget=10000 "$@"
}
run_browser --dump-dom "file://$page#sort-check" >"$work/dom.html" 2>"$work/console.log" || fail "chromium: $(tail -3 "$work/console.log")"
run_browser --screenshot="$work/shot.png" --window-size=1280,2000 "file://$page" >/dev/null 2>>"$work/console.log" \
  || fail "chromium screenshot: $(tail -3 "$work/console.log")"

/usr/bin/python3 - "$page" "$work/dom.html" "$work/console.log" "$work/shot.png" <<'PY'
import re, sys
import matplotlib.image as mpimg
page = open(sys.argv[1], encoding="utf-8").read()
dom = open(sys.argv[2], encoding="utf-8").read()
console = open(sys.argv[3], encoding="utf-8", errors="replace").read()
shot = sys.argv[4]
body = re.search(r"<body([^>]*)>", dom)
assert body, "no <body> in the DOM"
attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))
tables, images = page.count("<table"), page.count("<img")
assert attrs.get("tables") == str(tables), f"the page has {tables} tables, the browser counted {attrs.get('tables')}"
assert tables >= 8, f"only {tables} tables"
assert attrs.get("images") == str(images) == "2", f"images in the page {images}, in the browser {attrs.get('images')}"
assert attrs.get("images-loaded") == "2", f"images decoded: {attrs.get('images-loaded')} of 2"
assert attrs.get("sort-check") == "ok", f"sorting: {attrs.get('sort-check')}"
assert "LRA" in dom and "published" in dom.lower(), "no LRA layout"
errors = [l for l in console.splitlines() if "CONSOLE" in l or "Uncaught" in l]
assert not errors, "console: " + " | ".join(errors[:3])
img = mpimg.imread(shot)
assert img.shape[0] == 2000 and img.shape[1] == 1280, f"screenshot {img.shape}"
rgb = img[..., :3]
ink = (rgb.sum(axis=2) < 2.7).mean()  # pixels that are not (nearly) white
assert 0.01 < ink < 0.9, f"the screenshot looks blank or flooded: {ink:.3f} of its pixels are ink"
print(f"report: {tables} tables, {images} images decoded, sorted both ways, no console error, screenshot {ink:.1%} ink")
PY
