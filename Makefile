# Rankscope: `make run` and `make test` are all a new user needs.
#
# TORCH picks the PyTorch build pip installs into .venv:
#   auto  (default) the CUDA build when `nvidia-smi -L` lists a GPU, else the CPU build
#   cpu   torch==2.13.0, which on machines that carry the CPU wheel (find-links) is that wheel
#   cuda  the default PyPI build (CUDA, several GB)
#   anything else is passed to pip as it is, e.g.
#         make install TORCH="torch --index-url https://download.pytorch.org/whl/cpu"

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TORCH  ?= auto
TORCH_CPU  ?= torch==2.13.0
TORCH_CUDA ?= torch
STAMP  := $(VENV)/.installed
# More pytest flags for make test (which lists its 12 slowest tests: the suite is held under
# 20 minutes on 2 cores).
PYTEST_ARGS ?=
# Tests run in this many pytest-xdist workers (2: the suite took 22 min in one process on 2
# cores, 15 in two, its real runs spending much of their time waiting on timeouts and starts).
TEST_WORKERS ?= 2

.PHONY: install run demo desktop test lint screenshot reliability gpu-check bench soak clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@spec='$(TORCH)'; \
	if [ "$$spec" = auto ]; then \
	  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; \
	  then spec=cuda; else spec=cpu; fi; \
	fi; \
	case "$$spec" in cpu) spec='$(TORCH_CPU)';; cuda) spec='$(TORCH_CUDA)';; esac; \
	echo "installing PyTorch: $$spec"; \
	$(PY) -m pip install --quiet $$spec
	$(PY) -m pip install --quiet -e ".[test,frameworks]"
	@touch $(STAMP)

# Opens the Rankscope window; without a display it trains the headless demo instead.
run: install
	@if [ -n "$$DISPLAY$$WAYLAND_DISPLAY$$QT_QPA_PLATFORM" ]; then $(PY) main.py; else \
	  echo "no display (DISPLAY and WAYLAND_DISPLAY unset): training the terminal demo instead"; \
	  $(MAKE) --no-print-directory demo; fi

# Adds Rankscope to this user's application menu (~/.local/share/applications, icons too).
desktop: install
	$(VENV)/bin/rankscope --install-desktop

demo: install
	$(PY) -m ddp_engine launch --model mlp --dataset synthetic --nproc 2 --max-steps 200

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: install lint
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=12 $(PYTEST_ARGS)

# docs/RELIABILITY.md from a run of the fault matrix (tests/faults/).
reliability: install
	RANKSCOPE_RELIABILITY=docs/RELIABILITY.md QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q tests/faults \
	  --deselect tests/faults/test_matrix.py::test_the_reliability_document_lists_every_case

# docs/GPU.md from every CUDA check on this machine (bench/gpu_check.py; under 8 minutes).
# Runs with the Python at hand, not .venv: on a GPU machine where nothing can be installed,
#   PYTHONPATH=. make gpu-check [PYTHON=python3] [GPU_CHECK_ARGS="--work /tmp/gpu-check"]
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) bench/gpu_check.py $(GPU_CHECK_ARGS)

# Every benchmark of docs/BENCHMARKS.md, one after the other (about 20 minutes on 2 cores).
# Each prints its measurements; nothing else may run meanwhile (ratios, but a noisy machine).
BENCHES = telemetry_overhead step_costs step_toggles report_cost launch_latency stop_latency \
	window_startup ingest_draw long_history frame_parts runs_index node_watch_cost
bench: install
	@for b in $(BENCHES); do echo "== bench/$$b.py"; \
	  QT_QPA_PLATFORM=offscreen $(PY) bench/$$b.py || exit 1; done

# Stopped at any moment, many times: 200 start/stop cycles of real runs mixing `ddp_engine stop`,
# SIGTERM, Ctrl+C and the app's Stop (bench/soak.py; about 18 minutes on 2 cores; not a speed
# benchmark). Its figures are in docs/RELIABILITY.md. SOAK_ARGS="--cycles 20 --seed 1" for less.
SOAK_ARGS ?=
soak: install
	QT_QPA_PLATFORM=offscreen $(PY) bench/soak.py $(SOAK_ARGS)

# docs/screenshots/ from the real window under Xvfb (docs/make_screenshots.py). Debian packages it needs:
SCREENSHOT_DEBS = xvfb xdotool x11-utils imagemagick libxcb-cursor0 libxkbcommon-x11-0 \
	libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-render-util0 libxcb-xinerama0 \
	libxcb-shape0 libegl1 libgl1 libfontconfig1 libdbus-1-3 fonts-dejavu-core
screenshot: install
	@command -v Xvfb >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SCREENSHOT_DEBS))
	$(PY) docs/make_screenshots.py docs/screenshots

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
