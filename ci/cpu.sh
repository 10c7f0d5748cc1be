#!/usr/bin/env bash
# The CPU pipeline: the README's two commands on a clean clone, no GPU,
# 2 cores. `make build-fork` installs what is missing (system packages with
# apt-get as root, tools through pip into the pin's venv); `make test` runs
# every check for the default pin and `check` for every pin. Prints the wall
# time of each stage.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
make build-fork
t1=$(date +%s)
echo "==> build-fork took $(( t1 - t0 )) s"
make test
echo "==> test took $(( $(date +%s) - t1 )) s; CI passed in $(( $(date +%s) - t0 )) s"
