#!/usr/bin/env bash
# The progress line under a real terminal: `sweep` inside a detached tmux pane 80 columns wide,
# its screen captured every 0.1 s (capture-pane -J joins a row the terminal wrapped, so a line
# that did not fit shows up longer than the pane). Passes when the line with the bar, the point
# and the time was seen while points ran, and no captured line was wider than the pane.
# usage: tests/check_progress_tmux.sh ATTNBENCH_EXE     (exit 77 = skipped: no tmux)
set -euo pipefail
exe="$1"
command -v tmux >/dev/null || { echo "skipped: tmux is not installed"; exit 77; }
work=$(mktemp -d -t attnbench-tmux.XXXXXX)
sock="attnbench-test-$$"
cleanup() { tmux -L "$sock" kill-server 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
cols=80
tmux -L "$sock" -f /dev/null new-session -d -s progress -x "$cols" -y 24 \
  "$exe sweep --attn flash,vanilla,local --seq 1024,2048 --heads 4 --dhead 64 --reps 3 --min-time 0.3 \
     --out $work/sweep.json 2>&1; echo exit=\$? > $work/done; sleep 60"
bar_seen=0 widest=0 widest_line=""
for _ in $(seq 1 900); do
  screen="$(tmux -L "$sock" capture-pane -p -J -t progress)"
  while IFS= read -r line; do
    n=$(printf '%s' "$line" | wc -m)
    if [ "$n" -gt "$widest" ]; then widest=$n; widest_line="$line"; fi
    if [[ "$line" =~ \[[#.]{20}\]\ \[[0-9]+/6\].*elapsed ]]; then bar_seen=1; fi
  done <<< "$screen"
  [ -f "$work/done" ] && break
  sleep 0.1
done
screen="$(tmux -L "$sock" capture-pane -p -J -t progress)"
[ -f "$work/done" ] || { echo "the sweep did not finish in 90 s; the screen:"; echo "$screen"; exit 1; }
grep -q "exit=0" "$work/done" || { echo "the sweep failed: $(cat "$work/done")"; echo "$screen"; exit 1; }
status=0
if [ "$bar_seen" != 1 ]; then
  echo "no progress line with the bar, the point and the elapsed time was seen; the last screen:"
  echo "$screen"; status=1
fi
if [ "$widest" -ge "$cols" ]; then
  echo "a line of $widest columns in a pane of $cols (it wrapped): $widest_line"; status=1
fi
[ "$status" = 0 ] && echo "progress seen, widest line $widest of $cols columns"
exit $status
