# The two commands of the project (see README.md).
PY := .venv/bin/python

.PHONY: setup demo test test-fast consumers
setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

test: setup
	$(PY) -m pytest -q -ra --durations=25

test-fast: setup
	$(PY) -m pytest -q -ra -m "not slow"

# vLLM, speculators, SGLang's source, EAGLE's trainer and llama.cpp, each in its own venv under .consumers/ (tests/test_consumers.py).
consumers: setup
	bash scripts/setup_consumers.sh
