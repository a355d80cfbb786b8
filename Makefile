# The course's commands. Quick start (README): `make lab` and `make test`.
# Both create .venv on first use and reinstall only when pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Jupyter refuses to run as root unless told; containers and CI often run as root.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
# No display (a server, a container, CI): don't try to open a browser, just print the URL.
BROWSER_FLAG := $(shell [ -z "$$DISPLAY$$WAYLAND_DISPLAY" ] && [ "$$(uname)" != Darwin ] && echo --no-browser)
# Extra pip arguments, e.g. PyTorch's CPU-only index on a Linux laptop without a GPU:
#   make PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu" lab
PIP_ARGS ?=
NBVAL_FLAGS := --nbval-lax --nbval-current-env --nbval-cell-timeout=300 -p no:cacheprovider

.PHONY: help install lab test unit-tests notebook-tests exercises check-exercises notebooks slides site lint clean new-unit

help:
	@echo "make lab        install on first use, then start JupyterLab on notebooks/00_start_here.ipynb"
	@echo "make test       install on first use, then run the whole test suite"
	@echo "make exercises  regenerate exercises/ from solutions/"
	@echo "make notebooks  re-execute notebooks/ and solutions/ in place, then regenerate exercises/"
	@echo "make slides     static reveal.js slides of every lecture in build/slides/ (open offline)"
	@echo "make site       the course as static HTML in build/site/ (lectures, slides, exercises, index)"
	@echo "make lint       ruff over course_lib/ and tests/"
	@echo "make new-unit NN=05 TOPIC=cpu_offload TITLE=\"CPU offload\"   start a unit from course_lib/units/_template/"

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is needed; found " + sys.version.split()[0] + ". Run: make PYTHON=python3.11 ...")'
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# torch comes from the pin in constraints.txt, never from an unpinned resolve.
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -c constraints.txt -e ".[lab,dev,units]"
	@touch $(STAMP)

lab: $(STAMP)
	@# Trust the course's notebooks (a signature in your Jupyter data folder) so their stored
	@# widgets draw before anything is run; an untrusted notebook shows a one-line note instead.
	@$(BIN)/jupyter trust notebooks/*.ipynb exercises/*.ipynb solutions/*.ipynb >/dev/null 2>&1 || true
	@# Serve the whole course (notebooks/, exercises/, solutions/) and open unit 00 first.
	$(BIN)/jupyter lab $(BROWSER_FLAG) $(ROOT_FLAG) --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb

test: $(STAMP)
	$(BIN)/python -m course_lib.grading.exercises check
	$(BIN)/pytest tests -q
	$(BIN)/pytest $(NBVAL_FLAGS) -q notebooks solutions

exercises: $(STAMP)
	$(BIN)/python -m course_lib.grading.exercises build

check-exercises: $(STAMP)
	$(BIN)/python -m course_lib.grading.exercises check

notebooks: $(STAMP)
	$(BIN)/python -m course_lib.grading.execute notebooks/*.ipynb solutions/*.ipynb
	$(BIN)/python -m course_lib.publish tag notebooks/*.ipynb
	$(BIN)/python -m course_lib.grading.exercises build

# Both fetch reveal.js, require.js, jQuery, MathJax and the widgets manager once (pinned, checked)
# into build/vendor/, so the pages open without a network.
slides: $(STAMP)
	$(BIN)/python -m course_lib.publish slides

site: $(STAMP)
	$(BIN)/python -m course_lib.publish site

lint: $(STAMP)
	$(BIN)/ruff check course_lib tests

new-unit: $(STAMP)
	$(BIN)/python -m course_lib.units.new_unit "$(NN)" "$(TOPIC)" $(if $(TITLE),"$(TITLE)")

clean:
	rm -rf $(VENV) .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
