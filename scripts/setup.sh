#!/usr/bin/env bash
# Installs the Debian packages attnbench builds and runs with. Idempotent: does nothing when
# everything is already installed.
set -euo pipefail
# usage: scripts/setup.sh [--tests]   (--tests: also what only the tests use)
packages=(g++ cmake ninja-build git libdnnl-dev libbenchmark-dev libgtest-dev nlohmann-json3-dev
          libfmt-dev libcli11-dev zlib1g-dev python3-matplotlib python3-numpy valgrind)
# The live cluster test (tests/slurm_live.sh) starts a private one-node Slurm; without these
# packages it reports itself skipped.
[ "${1-}" = --tests ] && packages+=(slurm-wlm munge)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null
