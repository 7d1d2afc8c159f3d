# Every target bootstraps .venv with the pinned dependencies in requirements.lock.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ARGS ?=

.PHONY: venv run test lint bench proto loadtest clean

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: venv
	$(PY) -m brokerlet serve $(ARGS)

test: venv
	$(PY) -m pytest $(ARGS)

lint: venv
	$(PY) -m ruff check brokerlet tests bench loadtests
	$(PY) -m mypy

bench: venv
	$(PY) -m bench $(ARGS)

# Regenerate the protobuf module from our own schema.
proto: venv
	$(PY) -m grpc_tools.protoc -Ibrokerlet/transport/protocol \
		--plugin=protoc-gen-mypy=$(VENV)/bin/protoc-gen-mypy \
		--python_out=brokerlet/transport/protocol \
		--mypy_out=brokerlet/transport/protocol \
		brokerlet/transport/protocol/pulsar.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
