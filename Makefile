# The two set-up commands (they install everything they need on a fresh Debian machine):
#   make demo   train a Bahdanau GRU on dates, translate, verify its gradients with sympy
#   make test   ruff + the whole test suite, then the CUDA tests under Numba's simulator (what CI runs)

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || ! command -v sudo >/dev/null 2>&1 || echo sudo)

.PHONY: demo test test-cuda lint setup dot browser clean

demo: setup dot
	$(VENV)/bin/tinygrad-attn demo

test: setup dot browser lint
	$(PY) -m pytest
	@$(MAKE) --no-print-directory test-cuda

# The CUDA tests again, under Numba's CUDA simulator (no GPU needed; tiny shapes).  A second
# run, because the simulator is chosen when numba is first imported; in the first run these
# tests skip unless there is a GPU.
CUDA_TESTS := tests/test_cuda.py tests/test_cuda_ptx.py tests/test_conformance.py tests/test_backends.py tests/test_optim.py \
	tests/test_formulas.py tests/test_optim_kernels.py tests/test_host_free_ops.py tests/test_fuse.py tests/test_compile_cuda.py \
	tests/test_compile.py tests/test_compile_decoding.py tests/test_compile_seq2seq_decoding.py \
	tests/test_rnn_gates.py

test-cuda: setup
	NUMBA_ENABLE_CUDASIM=1 $(PY) -m pytest -k cuda $(CUDA_TESTS)

lint: setup
	$(VENV)/bin/ruff check .

setup: $(STAMP)

# The virtualenv; Debian ships venv support separately (python3-venv), installed when missing.
$(PY):
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else "Python 3.11 or newer is needed, found %d.%d" % v[:2])'
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  rm -rf $(VENV); \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "python venv support is missing: installing python3-venv with apt-get"; \
	    $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); \
	  else \
	    echo "could not create a virtualenv: install Python's venv module (e.g. python3-venv)"; exit 1; \
	  fi; }

# The package (editable) with its dev extras; PyTorch is optional: its comparison tests skip without it.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q torch==2.13.0 || echo "note: torch==2.13.0 is not installed; the PyTorch reference tests will be skipped"
	@touch $(STAMP)

# Graphviz's dot renders computation graphs; the graph tests use the real binary.
dot:
	@command -v dot >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "Graphviz 'dot' is missing: installing graphviz with apt-get"; \
	    $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq graphviz >/dev/null; \
	  else \
	    echo "Graphviz 'dot' is missing and apt-get is not available: install Graphviz (e.g. 'brew install graphviz' or 'dnf install graphviz')"; \
	    exit 1; \
	  fi; }

# Chromium and its WebDriver open the attention explorer in the browser tests (Debian's packages).
browser:
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "Chromium or chromedriver is missing: installing chromium and chromium-driver with apt-get"; \
	    $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else \
	    echo "Chromium and chromedriver are missing and apt-get is not available: install them for the browser tests"; \
	    exit 1; \
	  fi; }

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
