# Two commands matter on a fresh machine (python3 + make only):
#   make demo   set up .venv and run the main job on the bundled envs
#   make test   set up .venv and run the whole test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: setup venv demo test lint bench clean

# The stamps are newer than pyproject.toml while the venv is current, so it is reused.
# `.stamp`: everything the tests, the linters and training need (dev, train, ray, local and the
# framework extras openenv, inspect, verifiers);
# `.demo-stamp`: what the demo runs and no more: the core and the local model, no torch, trl or ray.
$(VENV)/.stamp: pyproject.toml
	$(MAKE) --no-print-directory venv EXTRAS=dev,train,ray,local,openenv,inspect,verifiers
	@# verifiers 0.4.0 pins mcp==2.0.0 and runs on envforge's mcp 2.3: its dependencies come with the
	@# `verifiers` extra, verifiers itself without them (docs/integrations.md#verifiers)
	$(BIN)/python -m pip install -q --no-deps verifiers==0.4.0
	touch $@

$(VENV)/.demo-stamp: pyproject.toml
	@# a venv set up for everything (make setup, make test) already holds all the demo needs
	test $(VENV)/.stamp -nt pyproject.toml || $(MAKE) --no-print-directory venv EXTRAS=local
	touch $@

# Create (or update) the venv with the project and the extras in EXTRAS.
venv:
	@# bubblewrap confines model-written env code (docs/security.md); libseccomp2 ships with apt
	command -v bwrap >/dev/null || (apt-get update -q && apt-get install -y -q bubblewrap) \
		|| echo "bubblewrap not installed: confined envs will refuse to load (docs/security.md)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# llama-cpp-python compiles llama.cpp (~2 min on 2 idle cores); its multimodal library is not needed.
	@# pip -q is silent for minutes: a line every 30 s says the install goes on, also when piped to a file.
	@echo "installing envforge [$(EXTRAS)]; llama.cpp compiles from source unless pip has its wheel (2-4 min)"
	@(while sleep 30 >/dev/null 2>&1; do echo "  still installing ($$(date +%H:%M:%S))"; done) & ticker=$$!; \
	CMAKE_ARGS="-DLLAVA_BUILD=OFF" $(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"; status=$$?; \
	kill $$ticker 2>/dev/null; exit $$status

setup: $(VENV)/.stamp

demo: $(VENV)/.demo-stamp
	$(BIN)/envforge demo

test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider

# mypy sees the packages under their import names through a tree of links (pyproject [tool.mypy]).
TYPECHECK := build/typecheck/envforge

lint: setup
	$(BIN)/python -m ruff check . && $(BIN)/python -m ruff format --check .
	@# the top-level package's files (api/) are envforge's own; the packages are folders under it
	@mkdir -p $(TYPECHECK) && rm -f $(TYPECHECK)/*.py && for f in api/*.py; do ln -sfn ../../../$$f $(TYPECHECK)/$${f#api/}; done
	@for p in server synth harness trainer integrations cli; do ln -sfn ../../../$$p $(TYPECHECK)/$$p; done
	cd build/typecheck && ../../$(BIN)/python -m mypy --config-file ../../pyproject.toml -p envforge

bench: setup
	$(BIN)/python benchmarks/bench_serving.py

clean:
	rm -rf $(VENV) build *.egg-info
