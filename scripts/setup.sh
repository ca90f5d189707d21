#!/usr/bin/env bash
# Installs the Debian packages attnbench builds and runs with. Idempotent: does nothing when
# everything is already installed.
set -euo pipefail
# usage: scripts/setup.sh [--tests]   (--tests: also what only the tests use)
packages=(g++ cmake ninja-build git libdnnl-dev libbenchmark-dev libgtest-dev nlohmann-json3-dev
          libfmt-dev libcli11-dev zlib1g-dev libsqlite3-dev python3-matplotlib python3-numpy valgrind)
# Only the tests use these (without them those tests report themselves skipped): a private
# one-node Slurm for the live cluster test (tests/slurm_live.sh), and PyTorch with OpenBLAS for
# the peer rows (scripts/peers.py, tests/check_peers.sh), and sqlite3, which loads the SQL export
# in its test, tmux, the terminal the progress line is checked in (tests/check_progress_tmux.sh), and
# Chromium, the browser `attnbench report`'s page is opened in (tests/check_report.sh).
# No recommended packages: they would
# pull in hundreds of MB the tests do not use.
extras=()
[ "${1-}" = --tests ] && extras=(slurm-wlm munge python3-torch libopenblas0-openmp sqlite3 tmux chromium)
not_installed() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
missing=($(not_installed "${packages[@]}"))
missing_extras=($(not_installed "${extras[@]+"${extras[@]}"}"))
if [ ${#missing[@]} -eq 0 ] && [ ${#missing_extras[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]} ${missing_extras[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
[ ${#missing[@]} -eq 0 ] || $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
[ ${#missing_extras[@]} -eq 0 ] || $sudo apt-get install -y -qq --no-install-recommends "${missing_extras[@]}" >/dev/null
