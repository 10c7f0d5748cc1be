#!/usr/bin/env bash
# The GPU pipeline: run on the GPU host (no network) from the repo root, with
# build/bundle/ (`make bundle`: the pinned vLLM runtime, the fork's overlay
# with the stack's tests, the model folders) copied there.
#
#   bash ci/gpu.sh [tests] [bench] [smoke]     (default: all three)
#
# Results go to $OUT (the device tool's output folder) or build/results/gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/results/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
steps=${*:-tests bench smoke}
dest=/tmp/tagma-bench
status=0

python3 scripts/gpu/bundle.py install --bundle build/bundle --dest "$dest" || exit 1
export PYTHONPATH=$dest/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
# The image has no flashinfer: the PyTorch/Triton sampler for both backends.
export VLLM_USE_FLASHINFER_SAMPLER=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import sys, vllm._tagma_C as m; print('python', sys.version.split()[0], m.__file__)" ||
  status=1

for step in $steps; do
  echo "==> $step"
  case $step in
    tests)
      # Test model names resolve to the config-only folders, as in CI. The
      # plug-in point's and the held-slots tests and the tagma scheduler soak
      # need upstream's tests/v1/core/utils.py, which the bundle does not
      # carry; they have no CUDA part (CI runs them).
      redirect=$(python3 -c "import pathlib, sys; sys.path.insert(0, 'tests/conformance')
from run import redirect_file; print(redirect_file(pathlib.Path(sys.argv[1])))" "$OUT")
      (cd "$dest/site" && VLLM_MODEL_REDIRECT_PATH=$redirect \
        python3 -m pytest -q -p no:cacheprovider -rs \
        --junitxml="$OUT/gpu-tests.xml" tests \
        --ignore=tests/v1/core/test_kv_cache_manager_plugin.py \
        --ignore=tests/v1/core/test_kv_cache_manager_held_slots.py \
        --deselect=tests/v1/core/test_tagma_kv_cache_manager.py::test_tagma_scheduler_soak_keeps_every_invariant) ||
        status=1 ;;
    bench)
      python3 scripts/bench/write_path.py --out "$OUT" || status=1 ;;
    smoke)
      python3 scripts/gpu/smoke_e2e.py --model "$dest/data/models/llama-3.2-1b" --out "$OUT" ||
        status=1 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
exit $status
