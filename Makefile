# tagma-vllm: the front door. `make help` lists every target.
#
# Every target works on one pinned vLLM release: VLLM_VERSION=<version>
# (default: the one patches/default names). Its stack is patches/vllm-<v>/,
# its build outputs build/vllm-<v>/ (venv, tree, worktree).
SHELL := /bin/bash
.DEFAULT_GOAL := help

BUILD   ?= build
DEFAULT_VERSION := $(strip $(file < patches/default))
VLLM_VERSION ?= $(DEFAULT_VERSION)

# A version is digits, dots and lower-case letters: it names folders and is
# passed to the tools, so nothing else may reach a shell.
_vok := 0 1 2 3 4 5 6 7 8 9 . a b c d e f g h i j k l m n o p q r s t u v w x y z
_vstrip = $(if $(2),$(call _vstrip,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,99,$(2))),$(1))
ifneq ($(words $(VLLM_VERSION)),1)
$(error VLLM_VERSION='$(VLLM_VERSION)' is not one release version, e.g. 0.26.0)
endif
ifneq ($(call _vstrip,$(VLLM_VERSION),$(_vok)),)
$(error VLLM_VERSION='$(VLLM_VERSION)' is not a release version (digits, dots, letters), e.g. 0.26.0)
endif
ifneq ($(words $(FROM)),$(if $(FROM),1,0))
$(error FROM='$(FROM)' is not one release version)
endif
ifneq ($(call _vstrip,$(FROM),$(_vok)),)
$(error FROM='$(FROM)' is not a release version (digits, dots, letters))
endif

PIN_BUILD := $(BUILD)/vllm-$(VLLM_VERSION)
STACK   := patches/vllm-$(VLLM_VERSION)
VENV    := $(PIN_BUILD)/venv
PY      := $(VENV)/bin/python
FORK    := PYTHONPATH=scripts $(PY) -m tagma_fork --pin $(VLLM_VERSION)
TOOLS   := $(VENV)/.tagma-tools
CMAKE   := $(VENV)/bin/cmake
CTEST   := $(VENV)/bin/ctest
TAGMA_RANDOM_OPS ?= 1000000
BENCH_RUNS ?= 5
export TAGMA_BUILD := $(abspath $(BUILD))

.PHONY: help venv fetch apply build-fork worktree export check rebase \
        rebase-continue rebase-abort pr-branch test test-tooling lint-stack \
        test-conformance test-engine test-bindings test-bindings-asan bench-host bench-sched bench-alloc bench-write-host bench-construct format-check \
        bundle bench-gpu bench-offline soak-gpu test-bench-gpu prereqs check-pins lint pins

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

$(TOOLS): scripts/requirements.txt
	@mkdir -p $(PIN_BUILD)
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet -r scripts/requirements.txt
	@touch $@

pins: ## list the pinned releases (* = default)
	@for d in patches/vllm-*/; do v=$${d#patches/vllm-}; v=$${v%/}; \
	  printf '  %s %s\n' "$$([ "$$v" = "$(DEFAULT_VERSION)" ] && echo '*' || echo ' ')" "$$v"; done

prereqs: ## check the system packages build and test need (no install)
	PYTHONPATH=scripts python3 -m tagma_fork prereqs

venv: $(TOOLS) ## the pin's venv (build/vllm-<v>/venv) with the fork tooling's deps

fetch: $(TOOLS) ## download the pin's sdist into the cache (sha256 checked)
	$(FORK) fetch

apply: $(TOOLS) ## build/vllm-<v>/tree = pristine sdist + the pin's series + csrc/tagma
	$(FORK) apply

build-fork: ## install what is missing (system packages as root), apply, install the patched vLLM into build/vllm-<v>/venv
	PYTHONPATH=scripts python3 -m tagma_fork prereqs --install
	$(MAKE) --no-print-directory $(TOOLS)
	$(FORK) build

worktree: $(TOOLS) ## build/vllm-<v>/worktree: base + one commit per patch (FORCE=1 discards)
	$(FORK) worktree $(if $(FORCE),--force)

export: $(TOOLS) ## write the worktree back into patches/vllm-<v>/ (canonical)
	$(FORK) export

check: $(TOOLS) ## the pin's stack: lint, apply on the pinned sdist, re-export, no drift
	$(FORK) check

check-pins: $(TOOLS) ## check every pin in patches/
	$(FORK) check --all

# rebase: VLLM_VERSION is the release to port to, FROM the pin to port from.
ifneq ($(filter command line environment,$(origin VLLM_VERSION)),)
rebase: $(TOOLS) ## port the stack of FROM (default pin) to VLLM_VERSION=<new> as a new pin (DRY_RUN=1 reports per patch)
	PYTHONPATH=scripts $(PY) -m tagma_fork --pin $(or $(FROM),$(DEFAULT_VERSION)) \
	  rebase --to $(VLLM_VERSION) $(if $(DRY_RUN),--dry-run)
else
rebase:
	@echo "usage: make rebase VLLM_VERSION=<new release> [FROM=<pin>] [DRY_RUN=1]"; exit 2
endif

rebase-continue: $(TOOLS) ## continue a rebase stopped at a conflict
	$(FORK) rebase --continue

rebase-abort: $(TOOLS) ## give up a rebase; patches/ stays (and is checked to be) as it was
	$(FORK) rebase --abort

pr-branch: $(TOOLS) ## PR branches tagma/pr/<v>/plugin (first patch), /<name> (each patch with a Standalone-PR: <name> trailer) and /full (engine + every patch) in build/vllm-<v>/pr, on the newest pin (VLLM_VERSION=<v> picks one); author and sign-off: your git identity; TAGMA_AI_COAUTHOR=<tool> (default Claude); PR_<variant>.md; DRY_RUN=1 plans only
	PYTHONPATH=scripts $(PY) -m tagma_fork $(if $(filter command line environment,$(origin VLLM_VERSION)),--pin $(VLLM_VERSION)) \
	  pr-branch $(if $(DRY_RUN),--dry-run)

lint: $(TOOLS) ## ruff + mypy over the tooling and tests
	$(PY) -m ruff check scripts tests csrc/tagma
	$(PY) -m ruff format --check scripts tests csrc/tagma
	$(PY) -m mypy scripts/tagma_fork scripts/gpu

STACK_MODULES := vllm/config/kv_cache_backend.py vllm/v1/core/tagma_kv_cache_manager.py \
                 vllm/v1/worker/gpu/tagma_block_table.py vllm/tagma/__init__.py \
                 vllm/entrypoints/api_server_listener.py

lint-stack: ## ruff + mypy over the stack's new vLLM modules (in build/vllm-<v>/tree)
	cd $(PIN_BUILD)/tree && $(abspath $(PY)) -m ruff check $(STACK_MODULES) && \
	  $(abspath $(PY)) -m ruff format --check $(STACK_MODULES) && \
	  $(abspath $(PY)) -m mypy --follow-imports=silent --ignore-missing-imports \
	    --python-version 3.11 $(STACK_MODULES)

test-tooling: $(TOOLS) ## pytest the fork tooling (apply, export, drift, rebase)
	$(PY) -m pytest -q tests/tooling

CONFORMANCE := $(PY) tests/conformance/run.py --tree $(PIN_BUILD)/tree \
  --manifest $(STACK)/conformance.toml --out $(BUILD)/results/conformance/$(VLLM_VERSION)
test-conformance: ## vLLM's tests/v1/core + the stack's tests, under paged and tagma (needs build-fork)
	$(CONFORMANCE) --backend paged
	$(CONFORMANCE) --backend tagma

test-engine: $(TOOLS) ## engine tests under ASan+UBSan (TAGMA_RANDOM_OPS=N, default 10^6)
	$(CMAKE) -S csrc/tagma -B $(PIN_BUILD)/tagma-asan -DTAGMA_SANITIZE=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTAGMA_RANDOM_OPS=$(TAGMA_RANDOM_OPS) >/dev/null
	$(CMAKE) --build $(PIN_BUILD)/tagma-asan -j2
	$(CTEST) --test-dir $(PIN_BUILD)/tagma-asan --output-on-failure -j2

bench-host: $(TOOLS) ## engine (FreeRuns) host benchmark: BENCH_RUNS runs, JSON + plots in build/results/bench_kv_engine
	$(CMAKE) -S csrc/tagma -B $(PIN_BUILD)/tagma-rel -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(CMAKE) --build $(PIN_BUILD)/tagma-rel -j2 --target bench_kv_engine
	@mkdir -p $(BUILD)/results/bench_kv_engine
	@for i in $$(seq 1 $(BENCH_RUNS)); do echo "run $$i/$(BENCH_RUNS)"; \
	  $(PIN_BUILD)/tagma-rel/bench_kv_engine --json $(BUILD)/results/bench_kv_engine/tagma-run=$$i.json || exit 1; done
	$(PY) csrc/tagma/bench/plot_bench.py $(BUILD)/results/bench_kv_engine/tagma-run=*.json

bench-sched: build-fork ## scheduler-thread benchmark, paged vs tagma (CPU, no model)
	cd $(PIN_BUILD)/tree && $(abspath $(PY)) $(abspath scripts/bench/sched.py) $(BENCH_ARGS)

bench-alloc: build-fork ## the two allocate_slots calls a decode step still makes (block completed, block boundary), per call, paged vs tagma (CPU)
	cd $(PIN_BUILD)/tree && $(abspath $(PY)) $(abspath scripts/bench/alloc_calls.py) $(BENCH_ARGS)

bench-write-host: build-fork ## the write path's host side per decode step (block-table appends + staging), paged vs tagma (CPU)
	cd $(PIN_BUILD)/tree && $(abspath $(PY)) $(abspath scripts/bench/write_path_host.py) $(BENCH_ARGS)

bench-construct: build-fork ## KV-cache manager start-up at 10^5 and 10^6 blocks, paged vs tagma (CPU): time, bytes per block
	cd $(PIN_BUILD)/tree && $(abspath $(PY)) $(abspath scripts/bench/construct.py) $(BENCH_ARGS)

bundle: build-fork ## offline GPU benchmark bundle in build/bundle (pinned runtime + fork overlay + data)
	$(PY) scripts/gpu/bundle.py build --out $(BUILD)/bundle --pin $(VLLM_VERSION)

BENCH_GPU_ARGS ?=
BENCH_GPU_OUT ?= $(BUILD)/results/bench-gpu
bench-gpu: ## on the GPU host: paged vs tagma serve benchmark, ABBA (needs build/bundle; BENCH_GPU_ARGS)
	python3 scripts/gpu/bench_serve.py --bundle $(BUILD)/bundle --out $(BENCH_GPU_OUT) $(BENCH_GPU_ARGS)

BENCH_OFFLINE_OUT ?= $(BUILD)/results/bench-offline
bench-offline: ## on the GPU host: offline engine throughput (vllm bench throughput, 1B host-bound), paged-stock/paged/tagma mirrored (needs build/bundle; BENCH_GPU_ARGS)
	python3 scripts/gpu/offline.py --bundle $(BUILD)/bundle --out $(BENCH_OFFLINE_OUT) $(BENCH_GPU_ARGS)

SOAK_ARGS ?=
SOAK_OUT ?= $(BUILD)/results/soak
soak-gpu: ## on the GPU host: tagma under vllm serve, 8 min of arrivals with drops and preemption, then idle: usage 0 and validate() (needs build/bundle; SOAK_ARGS)
	python3 scripts/gpu/soak.py --bundle $(BUILD)/bundle --out $(SOAK_OUT) $(SOAK_ARGS)

test-bench-gpu: ## the GPU benchmark's harness on CPU: bundle checks, ABBA, gate, profile, report, scheduler hook (needs build-fork)
	$(PY) -m pytest -q -p no:cacheprovider tests/bench_gpu

# abi3audit in a venv of its own: its attrs is newer than vLLM's test lock allows.
ABI3AUDIT := $(BUILD)/abi3audit/bin/abi3audit
$(ABI3AUDIT):
	python3 -m venv $(BUILD)/abi3audit
	$(BUILD)/abi3audit/bin/pip install --quiet abi3audit==0.0.26

test-bindings: $(ABI3AUDIT) ## _tagma_C: its pytest suite (-X dev, leak checks) and abi3audit (needs build-fork)
	TAGMA_EXT_DIR=$(PIN_BUILD)/tagma-ext TAGMA_PY_ENGINE=$(PIN_BUILD)/tree/vllm/tagma/free_runs.py \
	  $(PY) -X dev -m pytest -q -p no:cacheprovider csrc/tagma/tests/python
	$(ABI3AUDIT) --assume-minimum-abi3 3.11 -S -s $(PIN_BUILD)/tagma-ext/_tagma_C.abi3.so

test-bindings-asan: ## _tagma_C's pytest suite against an ASan+UBSan build of it (needs build-fork)
	$(CMAKE) -S csrc/tagma -B $(PIN_BUILD)/tagma-asan-py -DTAGMA_SANITIZE=ON -DTAGMA_PYTHON_EXT=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE=$(abspath $(PY)) >/dev/null
	$(CMAKE) --build $(PIN_BUILD)/tagma-asan-py -j2 --target _tagma_C
	# The sanitizer runtime must load before the interpreter; CPython's own
	# allocations at exit are not leaks of the module (refcount and
	# tracemalloc checks in the suite cover those).
	LD_PRELOAD=$$(c++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  TAGMA_EXT_DIR=$(PIN_BUILD)/tagma-asan-py TAGMA_PY_ENGINE=$(PIN_BUILD)/tree/vllm/tagma/free_runs.py \
	  $(PY) -m pytest -q -p no:cacheprovider csrc/tagma/tests/python

format-check: $(TOOLS) ## clang-format (pinned in scripts/requirements.txt) over the engine
	$(VENV)/bin/clang-format --dry-run -Werror $$(find csrc/tagma -name '*.h' -o -name '*.cpp')

test: ## the README's test command: everything CI runs (after make build-fork)
	@PYTHONPATH=scripts python3 -m tagma_fork prereqs || \
	  { echo "make test: run make build-fork first (it installs these)"; exit 2; }
	@[ -x $(PY) ] && [ -f $(PIN_BUILD)/tree/vllm/__init__.py ] || \
	  { echo "make test: no build for vllm $(VLLM_VERSION) in $(PIN_BUILD); run make build-fork VLLM_VERSION=$(VLLM_VERSION) first"; exit 2; }
	$(MAKE) --no-print-directory check-pins lint lint-stack format-check test-tooling \
	  test-engine test-bindings test-bindings-asan test-conformance test-bench-gpu
	PYTHONPATH=scripts $(PY) -m tagma_fork.record --pin $(VLLM_VERSION) --started $(shell date +%s)
