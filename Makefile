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
NBVAL_FLAGS := --nbval-lax --nbval-current-env --nbval-cell-timeout=300
# Tests run in two worker processes (pytest-xdist): on 2 cores a serial run keeps them a third busy,
# most tests waiting on ranks, kernels or a browser. Tests go to whichever worker is free a module
# at a time (loadscope), so a module's fixtures (a kernel, a rank set, a browser) start once; a
# lecture's cells stay together on one worker, in order, in one kernel (loadfile). PYTEST_JOBS=0
# runs everything in one process (pytest -n 0).
PYTEST_JOBS ?= 2
XDIST := -n $(PYTEST_JOBS)
# The fast lane: every library test that needs no notebook or kernel, browser, torchrun or long run.
FAST := -m "not slow and not notebook and not browser and not cluster"
# Two installs for two users: a learner's (`make lab`: lectures and exercises, grading included)
# and a maintainer's (`make test`: the same plus the maintainers' tools (course_tools: site,
# slides, exercise generator, benchmarks), pytest, nbval, playwright, ruff and mypy, and every
# optional extra). What units 04 and 07 add (bitsandbytes, peft, transformers) a learner
# asks for by name: `make lab EXTRAS=units` (or adam8bit, lora; several: EXTRAS=adam8bit,lora);
# each set of extras has its own stamp, so asking installs them once.
EXTRAS ?=
comma := ,
LAB_EXTRAS := lab$(if $(EXTRAS),$(comma)$(EXTRAS))
LAB_STAMP := $(VENV)/.installed-lab$(if $(EXTRAS),-$(subst $(comma),-,$(EXTRAS)))
# The oldest torch the course supports (pyproject.toml's floor), tested by `make test-torch-floor`
# in a virtual environment of its own. Its CPU wheel comes from PyTorch's CPU index.
TORCH_FLOOR ?= 2.11.0
FLOOR_VENV ?= .venv-floor
FLOOR_TORCH_ARGS ?= --index-url https://download.pytorch.org/whl/cpu

# The tests let Python write bytecode (__pycache__/, ignored by git) even where the environment
# says not to (PYTHONDONTWRITEBYTECODE=1, as some images set): otherwise each of the suite's
# hundreds of processes (kernels, graders, zygotes, torchrun ranks, pytest's workers) compiles
# course_lib again and pytest rewrites every test module again. Measured on 2 cores: collecting
# the library tests costs each pytest worker 16 s of CPU with it set, 11 s without; one pair of
# library runs took 771 s with it set and 680 s without.
test test-fast test-torch-floor: export PYTHONDONTWRITEBYTECODE :=

.PHONY: help install install-lab lab lab-instructor test test-fast test-torch-floor check lint format typecheck gpu-check exercises check-exercises notebooks slides site clean new-unit

help:
	@echo "make lab        install on first use, then start JupyterLab on notebooks/00_start_here.ipynb"
	@echo "make lab-instructor   the same, with solutions/ listed in the file browser"
	@echo "make lab EXTRAS=units   the same, adding what units 04 and 07 use (bitsandbytes, peft)"
	@echo "make test       install on first use, then run the whole test suite"
	@echo "make test-fast  the fast lane: library tests with no notebook, kernel, browser or torchrun (~3 min)"
	@echo "make check      ruff check, ruff format --check and mypy (what CI runs before the tests)"
	@echo "make format     apply ruff format"
	@echo "make gpu-check  run the course's CUDA paths on this machine's GPU and write a report in docs/"
	@echo "make test-torch-floor   the fast lane against the oldest supported torch ($(TORCH_FLOOR)) in $(FLOOR_VENV)"
	@echo "make exercises  regenerate exercises/ from solutions/"
	@echo "make notebooks  re-execute notebooks/ and solutions/ in place, then regenerate exercises/"
	@echo "make slides     static reveal.js slides of every lecture in build/slides/ (open offline)"
	@echo "make site       the course as static HTML in build/site/ (lectures, slides, exercises, index)"
	@echo "make lint       ruff check over course_lib/, course_tools/ and tests/"
	@echo "make new-unit NN=05 TOPIC=cpu_offload TITLE=\"CPU offload\"   start a unit from course_lib/units/_template/"

install: $(STAMP)
install-lab: $(LAB_STAMP)

define PYTHON_CHECK
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is needed; found " + sys.version.split()[0] + ". Run: make PYTHON=python3.11 ...")'
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
endef

# A learner's install: the package, JupyterLab and what the lectures and exercises use (plus the
# extras named in EXTRAS).
$(LAB_STAMP): pyproject.toml constraints.txt
	$(PYTHON_CHECK)
	@# torch comes from the pin in constraints.txt, never from an unpinned resolve.
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -c constraints.txt -e ".[$(LAB_EXTRAS)]"
	@touch $(LAB_STAMP)

# A maintainer's install adds the maintainers' tools and the test, browser, lint and type-checking tools.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON_CHECK)
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -c constraints.txt -e ".[lab,units,tools,dev]"
	@touch $(STAMP) $(LAB_STAMP)

# `make lab` lists no solutions/ in the learner's file browser; `make lab-instructor` does
# (COURSE_SOLUTIONS=show, read by jupyter/jupyter_server_config.py).
lab-instructor: export COURSE_SOLUTIONS := show
lab lab-instructor: $(LAB_STAMP)
	@# Trust the course's notebooks (a signature in your Jupyter data folder) so their stored
	@# widgets draw before anything is run; an untrusted notebook shows a one-line note instead.
	@$(BIN)/jupyter trust notebooks/*.ipynb exercises/*.ipynb solutions/*.ipynb >/dev/null 2>&1 || true
	@# Serve the course (notebooks/, exercises/; solutions/ for an instructor) and open unit 00
	@# first, with the course's settings (jupyter/: no news pop-up; terminals keep PATH; printed
	@# text scrolls instead of wrapping) and .venv/bin first on PATH, so `python` in
	@# JupyterLab's terminal is the course's (the exercises' grade line).
	PATH="$(abspath $(BIN)):$$PATH" VIRTUAL_ENV="$(abspath $(VENV))" \
	JUPYTER_CONFIG_PATH="$(CURDIR)/jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	$(BIN)/jupyter lab $(BROWSER_FLAG) $(ROOT_FLAG) --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb

# The whole suite. Solutions run once, in tests/test_course.py, through the grader (a fresh kernel,
# every check cell compared with the solution's stored output); nbval runs the lectures, each on
# one worker in one kernel (loadfile). Two sessions, not one: measured on a fresh clone, one
# session mixing lectures with library tests took 28 minutes where the two took 25.
test: $(STAMP)
	$(BIN)/python -m course_tools.exercises check
	$(BIN)/pytest tests -q $(XDIST) --dist loadscope --durations=25
	$(BIN)/pytest $(NBVAL_FLAGS) -q $(XDIST) --dist loadfile --durations=10 notebooks

test-fast: $(STAMP)
	$(BIN)/pytest tests -q $(FAST) $(XDIST) --dist loadscope

# What CI runs before the tests: lint, formatting and types (strict mypy but for a named exclusion
# list; the last line prints its length and the dict[str, Any] returns, which may only shrink).
check: $(STAMP)
	$(BIN)/ruff check course_lib course_tools tests conftest.py
	$(BIN)/ruff format --check course_lib course_tools tests conftest.py
	$(BIN)/mypy
	$(BIN)/python tests/test_typing_debt.py

format: $(STAMP)
	$(BIN)/ruff format course_lib course_tools tests conftest.py

typecheck: $(STAMP)
	$(BIN)/mypy

gpu-check: $(LAB_STAMP)
	$(BIN)/python -m course_tools.gpu_check --out docs

# The fast lane against the oldest supported torch, in a virtual environment of its own.
test-torch-floor:
	@[ -x $(FLOOR_VENV)/bin/python ] || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet --upgrade pip
	@echo "torch==$(TORCH_FLOOR)" > $(FLOOR_VENV)/constraints.txt
	@# the course's other pins (constraints.txt), torch's replaced by the floor
	@grep -v '^torch==' constraints.txt >> $(FLOOR_VENV)/constraints.txt
	$(FLOOR_VENV)/bin/python -m pip install --quiet $(FLOOR_TORCH_ARGS) -c $(FLOOR_VENV)/constraints.txt "torch==$(TORCH_FLOOR)"
	$(FLOOR_VENV)/bin/python -m pip install --quiet $(PIP_ARGS) -c $(FLOOR_VENV)/constraints.txt -e ".[lab,units,tools,dev]"
	$(FLOOR_VENV)/bin/python -c 'import torch; v = torch.__version__; print("torch", v); assert v.split("+")[0] == "$(TORCH_FLOOR)", v'
	$(FLOOR_VENV)/bin/pytest tests -q $(FAST) $(XDIST) --dist loadscope

exercises: $(LAB_STAMP)
	$(BIN)/python -m course_tools.exercises build

check-exercises: $(LAB_STAMP)
	$(BIN)/python -m course_tools.exercises check

notebooks: $(STAMP)
	$(BIN)/python -m course_tools.execute notebooks/*.ipynb solutions/*.ipynb
	$(BIN)/python -m course_tools.publish nav notebooks/*.ipynb
	$(BIN)/python -m course_tools.publish tag notebooks/*.ipynb
	$(BIN)/python -m course_tools.exercises build

# Both fetch reveal.js, require.js, jQuery, MathJax and the widgets manager once (pinned, checked)
# into build/vendor/, so the pages open without a network.
slides: $(STAMP)
	$(BIN)/python -m course_tools.publish slides

site: $(STAMP)
	$(BIN)/python -m course_tools.publish site

lint: $(STAMP)
	$(BIN)/ruff check course_lib course_tools tests conftest.py

new-unit: $(STAMP)
	$(BIN)/python -m course_tools.new_unit "$(NN)" "$(TOPIC)" $(if $(TITLE),"$(TITLE)")

clean:
	rm -rf $(VENV) $(FLOOR_VENV) .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
