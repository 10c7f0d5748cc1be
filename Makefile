# tagma-vllm: the front door. `make help` lists every target.
SHELL := /bin/bash
.DEFAULT_GOAL := help

BUILD   ?= build
VENV    := $(BUILD)/venv
PY      := $(VENV)/bin/python
FORK    := PYTHONPATH=scripts $(PY) -m tagma_fork
TOOLS   := $(VENV)/.tagma-tools
VLLM_VERSION ?=
CMAKE   := $(VENV)/bin/cmake
CTEST   := $(VENV)/bin/ctest
TAGMA_RANDOM_OPS ?= 1000000
BENCH_RUNS ?= 5

.PHONY: help venv fetch apply build-fork worktree export check rebase \
        rebase-continue rebase-abort pr-branch test test-tooling lint-stack \
        test-conformance test-engine test-bindings bench-host bench-sched format-check \
        bundle bench-gpu test-bench-gpu

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

$(TOOLS): scripts/requirements.txt
	@mkdir -p $(BUILD)
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -r scripts/requirements.txt
	@touch $@

venv: $(TOOLS) ## the tool venv (build/venv) with the fork tooling's deps

fetch: $(TOOLS) ## download the pinned sdist into the cache (sha256 checked)
	$(FORK) fetch

apply: $(TOOLS) ## build/tree = pristine sdist + patches/series + csrc/tagma
	$(FORK) apply

build-fork: $(TOOLS) ## apply, then install the patched vLLM into build/venv
	$(FORK) build

worktree: $(TOOLS) ## build/worktree: base + one commit per patch (FORCE=1 discards)
	$(FORK) worktree $(if $(FORCE),--force)

export: $(TOOLS) ## write build/worktree back into patches/ (canonical)
	$(FORK) export

check: $(TOOLS) ## lint the series, apply on the pinned sdist, re-export, no drift
	$(FORK) check

rebase: $(TOOLS) ## move the stack to VLLM_VERSION (DRY_RUN=1 reports per patch)
	$(FORK) rebase --to $(VLLM_VERSION) $(if $(DRY_RUN),--dry-run)

rebase-continue: $(TOOLS) ## continue a rebase stopped at a conflict
	$(FORK) rebase --continue

rebase-abort: $(TOOLS) ## give up a rebase; patches/ and upstream/ stay as they were
	$(FORK) rebase --abort

pr-branch: $(TOOLS) ## build/pr: upstream + one signed-off commit per patch + engine
	$(FORK) pr-branch

lint: $(TOOLS) ## ruff + mypy over the tooling and tests
	$(PY) -m ruff check scripts tests csrc/tagma
	$(PY) -m ruff format --check scripts tests csrc/tagma
	$(PY) -m mypy scripts/tagma_fork scripts/gpu

STACK_MODULES := vllm/config/kv_cache_backend.py vllm/v1/core/tagma_kv_cache_manager.py \
                 vllm/v1/worker/gpu/tagma_block_table.py vllm/tagma/__init__.py

lint-stack: ## ruff + mypy over the stack's new vLLM modules (in build/tree)
	cd $(BUILD)/tree && $(abspath $(PY)) -m ruff check $(STACK_MODULES) && \
	  $(abspath $(PY)) -m ruff format --check $(STACK_MODULES) && \
	  $(abspath $(PY)) -m mypy --follow-imports=silent --ignore-missing-imports \
	    --python-version 3.11 $(STACK_MODULES)

test-tooling: $(TOOLS) ## pytest the fork tooling (apply, export, drift, rebase)
	$(PY) -m pytest -q tests/tooling

test-conformance: ## vLLM's tests/v1/core + the stack's tests, under paged and tagma (needs build-fork)
	$(PY) tests/conformance/run.py --backend paged
	$(PY) tests/conformance/run.py --backend tagma

test-engine: $(TOOLS) ## engine tests under ASan+UBSan (TAGMA_RANDOM_OPS=N, default 10^6)
	$(CMAKE) -S csrc/tagma -B $(BUILD)/tagma-asan -DTAGMA_SANITIZE=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTAGMA_RANDOM_OPS=$(TAGMA_RANDOM_OPS) >/dev/null
	$(CMAKE) --build $(BUILD)/tagma-asan -j2
	$(CTEST) --test-dir $(BUILD)/tagma-asan --output-on-failure -j2

bench-host: $(TOOLS) ## engine host benchmark: BENCH_RUNS runs, JSON + plots in build/results/bench_kv_engine
	$(CMAKE) -S csrc/tagma -B $(BUILD)/tagma-rel -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(CMAKE) --build $(BUILD)/tagma-rel -j2 --target bench_kv_engine
	@mkdir -p $(BUILD)/results/bench_kv_engine
	@for i in $$(seq 1 $(BENCH_RUNS)); do echo "run $$i/$(BENCH_RUNS)"; \
	  $(BUILD)/tagma-rel/bench_kv_engine --json $(BUILD)/results/bench_kv_engine/tagma-run=$$i.json || exit 1; done
	$(PY) csrc/tagma/bench/plot_bench.py $(BUILD)/results/bench_kv_engine/tagma-run=*.json

bench-sched: build-fork ## scheduler-thread benchmark, paged vs tagma (CPU, no model)
	cd $(BUILD)/tree && $(abspath $(PY)) $(abspath scripts/bench/sched.py) $(BENCH_ARGS)

bundle: build-fork ## offline GPU benchmark bundle in build/bundle (pinned runtime + fork overlay + data)
	$(PY) scripts/gpu/bundle.py build --out $(BUILD)/bundle

BENCH_GPU_ARGS ?=
BENCH_GPU_OUT ?= $(BUILD)/results/bench-gpu
bench-gpu: ## on the GPU host: paged vs tagma serve benchmark, ABBA (needs build/bundle; BENCH_GPU_ARGS)
	python3 scripts/gpu/bench_serve.py --bundle $(BUILD)/bundle --out $(BENCH_GPU_OUT) $(BENCH_GPU_ARGS)

test-bench-gpu: ## the GPU benchmark's harness on CPU: bundle checks, ABBA, gate, profile, report, scheduler hook (needs build-fork)
	$(PY) -m pytest -q -p no:cacheprovider tests/bench_gpu

# abi3audit in a venv of its own: its attrs is newer than vLLM's test lock allows.
ABI3AUDIT := $(BUILD)/abi3audit/bin/abi3audit
$(ABI3AUDIT):
	python3 -m venv $(BUILD)/abi3audit
	$(BUILD)/abi3audit/bin/pip install --quiet abi3audit==0.0.26

test-bindings: $(ABI3AUDIT) ## _tagma_C: its pytest suite (-X dev, leak checks) and abi3audit (needs build-fork)
	TAGMA_EXT_DIR=$(BUILD)/tagma-ext $(PY) -X dev -m pytest -q -p no:cacheprovider csrc/tagma/tests/python
	$(ABI3AUDIT) --assume-minimum-abi3 3.11 -S -s $(BUILD)/tagma-ext/_tagma_C.abi3.so

format-check: ## clang-format over the engine (vLLM's style)
	clang-format --dry-run -Werror $$(find csrc/tagma -name '*.h' -o -name '*.cpp')

test: build-fork ## the README's test command: everything CI runs
	$(MAKE) check lint lint-stack format-check test-tooling test-engine test-bindings \
	  test-conformance test-bench-gpu
