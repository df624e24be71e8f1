# Two set-up commands for users: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv java chromium systemd test lint typecheck pytest run chaos clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

# Spark (the pipeline, its tests, `make run`) needs Java 17+.
java:
	@if ! command -v java >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "java not found: installing openjdk-17-jre-headless (Spark needs Java 17+)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	  else \
	    echo "Spark needs Java 17+ and 'java' is not on PATH: install a JRE 17+" >&2; \
	    echo "(Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless; macOS: brew install openjdk@17)" >&2; \
	    exit 1; \
	  fi; \
	fi

# The nsqadmin browser tests drive Debian's chromium through Playwright (no browser download).
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "/usr/bin/chromium not found: installing Debian's chromium (nsqadmin browser tests)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "the nsqadmin browser tests need /usr/bin/chromium" >&2; \
	    echo "(Debian/Ubuntu: sudo apt-get install chromium)" >&2; \
	    exit 1; \
	  fi; \
	fi

# tests/deploy checks contrib/systemd/*.service with `systemd-analyze verify` (Debian's systemd;
# nothing is started or enabled, systemd need not be running).
systemd:
	@if ! command -v systemd-analyze >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "systemd-analyze not found: installing Debian's systemd (checks contrib/systemd units)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null; \
	  else \
	    echo "the contrib/systemd tests need systemd-analyze" >&2; \
	    echo "(Debian/Ubuntu: sudo apt-get install systemd)" >&2; \
	    exit 1; \
	  fi; \
	fi

lint: venv
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: venv
	$(BIN)/mypy

pytest: venv java chromium systemd
	$(BIN)/pytest -q

test: lint typecheck pytest

# The pipeline demo: nsqlookupd, two nsqd, a producer, the Spark jobs, a consumer. Ctrl-C stops.
run: venv java
	$(BIN)/python -m nsqpy.demo

# The chaos harness (docs/operations.md "Chaos"): a cluster in network namespaces under seeded
# faults, then the checker's report and plot in chaos-out/. Needs root.
# `make chaos SEED=7 DURATION=600`; Go's daemons: `make chaos CHAOS_ARGS='--nsqd-bin ...'`.
SEED ?= 1
DURATION ?= 120
CHAOS_ARGS ?=
chaos: venv
	$(BIN)/python -m pip install --quiet -e '.[chaos]'
	$(BIN)/python -m nsqpy.chaos --seed $(SEED) --duration $(DURATION) $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
