# Two commands do all set-up on a fresh machine:
#   make demo   install into .venv and start a local 3-node cluster (Ctrl-C stops it)
#   make test   install into .venv and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test install system-deps proto docs clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/raftkv dev up

# The network-partition tests drive nftables on loopback, and the power-loss tests mount a FUSE
# filesystem (root; Debian's nftables and fuse3 packages). A change-feed test runs Debian's kcat; the
# console's tests render its pages in Debian's chromium and check the alert rules with its prometheus;
# the service units are checked with systemd-analyze (systemd).
system-deps:
	@{ command -v nft && command -v fusermount3 && command -v kcat && command -v chromium && command -v promtool \
		&& command -v systemd-analyze; } >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq nftables fuse3 kcat chromium prometheus systemd >/dev/null; }

# The suite starts a thousand or so Python processes (nodes, learners, the CLI). Where the environment sets
# PYTHONDONTWRITEBYTECODE, each compiled every module of ours again at import (0.2 s of CPU): compiled once here.
test: install system-deps
	$(PY) -m compileall -q raftkv learners spark_connector >/dev/null
	$(PY) -m pytest -q

# Regenerate the gRPC code after editing raftkv/api/kv.proto (the generated files are committed).
proto: install
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. raftkv/api/kv.proto

# Redraw the pictures at the top of docs/architecture.md from the code (a test fails while they are stale).
docs: install
	$(PY) scripts/architecture.py

clean:
	rm -rf $(VENV) raftkv-data .pytest_cache .hypothesis
