# Every target bootstraps .venv with the pinned dependencies in requirements.lock.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ARGS ?=

.PHONY: venv compiled run test lint bench fuzz proto loadtest loadtest-compare clean

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	# An editable install is not byte-compiled; where PYTHONDONTWRITEBYTECODE is set, every
	# start would compile brokerlet again (~250 ms). A module edited since is compiled in memory.
	$(PY) -m compileall -q brokerlet >/dev/null
	touch $(STAMP)

# The hot modules compiled with mypyc into .compiled/ (brokerlet/_compiled.py), rebuilt when
# their sources change; without a C compiler brokerlet runs them from source.
compiled: venv
	$(PY) -m brokerlet._compile --or-source

run: compiled
	$(PY) -m brokerlet serve $(ARGS)

# The suite twice: with the compiled modules (what make run serves), then all from source
# (what an installed package runs).
test: compiled
	$(PY) -m brokerlet._compile --check
	$(PY) -m pytest $(ARGS)
	BROKERLET_PURE_PYTHON=1 $(PY) -m pytest $(ARGS)

lint: venv
	$(PY) -m ruff check brokerlet tests bench loadtests setup.py
	$(PY) -m mypy

bench: compiled
	$(PY) -m bench $(ARGS)

# Seeded bad input against a running broker (tests/fuzz.py): prints inputs tried, actor
# failures, topics usable and RSS before/after; fails if anything broke.
FUZZ_SECONDS ?= 60
SEED ?= 1
STORAGE ?= memory
fuzz: compiled
	$(PY) tests/fuzz.py --duration $(FUZZ_SECONDS) --seed $(SEED) --storage $(STORAGE) $(ARGS)

# Locust load tests (loadtests/README.md). Without SCENARIO: every scenario briefly
# (15 s of publishing each); with SCENARIO: that one at its full length, or for DURATION s.
SCENARIO ?=
DURATION ?=
loadtest: compiled
	$(PY) -m loadtests $(if $(SCENARIO),run $(SCENARIO),all) $(if $(DURATION),--duration $(DURATION)) $(ARGS)

# The same scenarios against brokerlet and pulsar-lite, interleaved, below and at saturation.
loadtest-compare: compiled
	$(PY) -m loadtests compare $(if $(SCENARIO),--scenario $(SCENARIO)) $(if $(DURATION),--duration $(DURATION)) $(ARGS)

# Regenerate the protobuf module from our own schema.
proto: venv
	$(PY) -m grpc_tools.protoc -Ibrokerlet/transport/protocol \
		--plugin=protoc-gen-mypy=$(VENV)/bin/protoc-gen-mypy \
		--python_out=brokerlet/transport/protocol \
		--mypy_out=brokerlet/transport/protocol \
		brokerlet/transport/protocol/pulsar.proto

clean:
	rm -rf $(VENV) .compiled .pytest_cache .mypy_cache .ruff_cache
