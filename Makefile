# The README's two commands live here: `make sim` (the main job) and `make test` (the whole suite).
# Both set up a virtual environment in .venv on first use; nothing is installed outside the project folder.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SCENARIO ?= sims/gpu-added.toml
POLICY ?= adaptive

.PHONY: setup sim test lint bench wheel clean results

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# Main job: simulate a GPU being added under the default policy; writes a plot and a JSON summary under out/.
sim: setup
	mkdir -p out
	$(BIN)/model-concurrency sim $(SCENARIO) --policy $(POLICY) --plot out/$(notdir $(basename $(SCENARIO))).png \
		--json out/$(notdir $(basename $(SCENARIO))).json

lint: setup
	$(BIN)/ruff check src tests benchmarks notebooks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts
	$(BIN)/mypy

# The whole suite: lint, types, then every test (slow ones included).
test: lint
	$(BIN)/python -m pytest -q

# The wheel users install: policies/ and sims/ ship inside it (see src/model_concurrency/bundled). .ci/run builds it
# first so tests/test_packaging.py installs this very file into a fresh venv.
wheel: setup
	rm -rf dist
	$(BIN)/python -m pip wheel --no-deps -q -w dist .

# docs/results.md, generated (never edit it by hand): one run, at this commit, of the bundled scenarios and the
# scenario generator (seed 41, 200 draws) at a quarter of their length, with the default policy and its peers, plus
# the quick live checks (benchmarks/conformance.py --quick); the page's tables are written from their CSVs, each
# beside the command that made it. The CSVs and the run's record are kept in docs/figures/report, from which
# `model-concurrency report --from docs/figures/report` rewrites the page (tests/test_docs_figures.py does). About
# 20 minutes on two idle cores with the oracle sweeps cached, half an hour more without.
results: setup
	$(BIN)/model-concurrency report --out docs/results.md --seed 41 --n 200 --scale 0.25 --work docs/figures/report
	rm -rf docs/figures/report/fuzz/scenarios docs/figures/report/bundled/compare.md docs/figures/report/fuzz/worst.md \
		docs/figures/report/compare.log docs/figures/report/fuzz.log

bench: setup
	for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) out dist build .pytest_cache .mypy_cache .ruff_cache .hypothesis
