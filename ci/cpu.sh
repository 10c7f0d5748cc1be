#!/usr/bin/env bash
# The CPU pipeline: system packages, then the README's test command.
# Runs on a clean clone, no GPU, 2 cores; prints the wall time of each stage.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)

# quilt: the test that `quilt push -a` gives the same tree as `git am`.
# doctest-dev, clang-format: the engine's tests and format check.
# xz-utils: the GPU bundle's pieces (make bundle, tests/bench_gpu).
need=()
for pkg in quilt doctest-dev clang-format xz-utils; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "==> apt-get install ${need[*]}"
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

make test
echo "==> CI passed in $(( $(date +%s) - t0 )) s"
