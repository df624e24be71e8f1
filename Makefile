# Two set-up commands for users: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv java chromium systemd nsqjs test lint typecheck pytest run chaos bench go-nsq clean

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

# tests/interop drives nsqjs (node) from tests/interop/clients: Debian's nodejs and npm, then
# the locked packages (package-lock.json) into its node_modules, again whenever the lock changes.
NSQJS_DIR := tests/interop/clients
nsqjs:
	@if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "node or npm not found: installing Debian's nodejs and npm (nsqjs interop tests)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	  else \
	    echo "the nsqjs interop tests need node and npm" >&2; \
	    echo "(Debian/Ubuntu: sudo apt-get install nodejs npm; macOS: brew install node)" >&2; \
	    exit 1; \
	  fi; \
	fi
	@if [ ! -d $(NSQJS_DIR)/node_modules ] || [ $(NSQJS_DIR)/package-lock.json -nt $(NSQJS_DIR)/node_modules ]; then \
	  cd $(NSQJS_DIR) && npm ci --no-audit --no-fund && touch node_modules; \
	fi

lint: venv
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: venv
	$(BIN)/mypy

pytest: venv java chromium systemd nsqjs
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

# The benchmark table (BENCHMARKS.md): nsqd beside Go nsqd 1.3, Go's bench tools as the load.
# `make bench GO_NSQ_BIN=<dir of Go's nsqd, nsqlookupd, bench_writer, bench_reader>` (default:
# build/go-nsq, from `make go-nsq`); `make bench BENCH_ARGS='--channels 1 --modes default'`.
GO_NSQ_BIN ?=
BENCH_ARGS ?=
bench: venv
	GO_NSQ_BIN='$(GO_NSQ_BIN)' $(BIN)/python bench/bench_table.py $(BENCH_ARGS)

# Go's nsqd, nsqlookupd, nsqadmin, the utilities and bench_writer/bench_reader/bench_channels
# into build/go-nsq. nsq's go.mod has a replace directive, which `go install pkg@version`
# refuses, so the module is downloaded and built as the main module. GO_NSQ_SRC=<nsq tree>
# builds an existing checkout instead (e.g. offline, with GOPROXY=off GOFLAGS=-mod=mod).
GO_NSQ_VERSION ?= v1.3.0
GO_NSQ_SRC ?=
go-nsq:
	@command -v go >/dev/null 2>&1 || { \
	  echo "make go-nsq needs Go 1.17+ on PATH (Debian/Ubuntu: sudo apt-get install golang-go)" >&2; \
	  exit 1; }
	@src='$(GO_NSQ_SRC)'; \
	if [ -z "$$src" ]; then \
	  found=$$(go mod download -json github.com/nsqio/nsq@$(GO_NSQ_VERSION)); \
	  src=$$(echo "$$found" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	  if [ -z "$$src" ]; then echo "$$found" >&2; exit 1; fi; \
	fi; \
	echo "building $$src into build/go-nsq"; \
	cd "$$src" && GOBIN='$(CURDIR)/build/go-nsq' go install ./apps/... ./bench/...

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
