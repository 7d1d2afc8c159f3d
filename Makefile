# Every target bootstraps .venv with the pinned dependencies in requirements.lock.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ARGS ?=

.PHONY: venv run test lint bench fuzz proto loadtest loadtest-compare clean

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	# An editable install is not byte-compiled; where PYTHONDONTWRITEBYTECODE is set, every
	# start would compile brokerlet again (~250 ms). A module edited since is compiled in memory.
	$(PY) -m compileall -q brokerlet >/dev/null
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

# Seeded bad input against a running broker (tests/fuzz.py): prints inputs tried, actor
# failures, topics usable and RSS before/after; fails if anything broke.
FUZZ_SECONDS ?= 60
SEED ?= 1
STORAGE ?= memory
fuzz: venv
	$(PY) tests/fuzz.py --duration $(FUZZ_SECONDS) --seed $(SEED) --storage $(STORAGE) $(ARGS)

# Locust load tests (loadtests/README.md). Without SCENARIO: every scenario briefly
# (15 s of publishing each); with SCENARIO: that one at its full length, or for DURATION s.
SCENARIO ?=
DURATION ?=
loadtest: venv
	$(PY) -m loadtests $(if $(SCENARIO),run $(SCENARIO),all) $(if $(DURATION),--duration $(DURATION)) $(ARGS)

# The same scenarios against brokerlet and pulsar-lite, interleaved, below and at saturation.
loadtest-compare: venv
	$(PY) -m loadtests compare $(if $(SCENARIO),--scenario $(SCENARIO)) $(if $(DURATION),--duration $(DURATION)) $(ARGS)

# Regenerate the protobuf module from our own schema.
proto: venv
	$(PY) -m grpc_tools.protoc -Ibrokerlet/transport/protocol \
		--plugin=protoc-gen-mypy=$(VENV)/bin/protoc-gen-mypy \
		--python_out=brokerlet/transport/protocol \
		--mypy_out=brokerlet/transport/protocol \
		brokerlet/transport/protocol/pulsar.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
