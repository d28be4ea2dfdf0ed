# gpufrac: `make demo` and `make test` are the whole set-up (they create .venv on first use).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Every version the venv installs (pip and setuptools included, also setuptools for building gpufrac),
# pinned; `make lock` refreshes it. The torch and onnx extras are not installed here, so not locked.
LOCK := requirements.lock
# Installed without their dependencies (each pins one gpufrac needs newer, for a part the tests do
# not use; what they import is in the dev extras): openapi-python-client pins typer<0.28 for its
# CLI, and tests/integration/test_openapi_client.py runs its generator as a library.
NO_DEPS := openapi-python-client

.PHONY: demo test lint typecheck unit bench gpu-check lock clean

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade -c $(LOCK) pip setuptools
	$(BIN)/python -m pip install --quiet -c $(LOCK) --build-constraint $(LOCK) -e '.[dev,ray]'
	$(BIN)/python -m pip install --quiet -c $(LOCK) --no-deps $(NO_DEPS)
	@touch $@

# Resolves pyproject.toml's dependencies afresh (the newest versions that fit) in a throwaway venv
# and writes what got installed to $(LOCK). Then `make test`, and commit the lock.
lock:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install --quiet --upgrade pip setuptools; \
	"$$tmp/venv/bin/python" -m pip install --quiet -e '.[dev,ray]'; \
	"$$tmp/venv/bin/python" -m pip install --quiet --no-deps $(NO_DEPS); \
	{ echo "# gpufrac's locked dependencies: pip constraints that make installs .venv with (-c)."; \
	  echo "# Written by \`make lock\` (do not edit): '.[dev,ray]' installed unconstrained in a fresh venv"; \
	  echo "# ($$("$$tmp/venv/bin/python" -c 'import platform as p; print("Python", p.python_version(), p.system(), p.machine())')), then"; \
	  echo "# pip freeze --all --exclude-editable. The torch and onnx extras are left out."; \
	  echo "# $(NO_DEPS): installed beside it without dependencies (see the Makefile)."; \
	  "$$tmp/venv/bin/python" -m pip freeze --all --exclude-editable; } > $(LOCK).tmp; \
	mv $(LOCK).tmp $(LOCK); echo "wrote $(LOCK): $$(grep -vc '^#' $(LOCK)) packages"

# The browser tests drive Debian's Chromium through Playwright (no browser download): installed once
# per machine when missing (as root, from Debian's package index).
CHROMIUM := /usr/bin/chromium
CHROMIUM_STAMP := $(VENV)/.chromium
$(CHROMIUM_STAMP): | $(STAMP)
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" != 0 ]; then echo "the browser tests need Chromium: sudo apt-get install chromium" >&2; exit 1; fi; \
	  echo "installing Chromium for the browser tests (once)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
	@touch $@

# tests/integration/test_top.py drives `gpufrac top` in tmux: installed once per machine when missing
# (as root, from Debian's package index; the index is updated only when the install needs it).
TMUX_STAMP := $(VENV)/.tmux
$(TMUX_STAMP): | $(STAMP)
	@command -v tmux >/dev/null || { \
	  if [ "$$(id -u)" != 0 ]; then echo "the terminal tests need tmux: sudo apt-get install tmux" >&2; exit 1; fi; \
	  echo "installing tmux for the terminal tests (once)"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq --no-install-recommends tmux >/dev/null 2>&1 \
	  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends tmux >/dev/null; }; }
	@touch $@

# tests/integration/test_container_runner.py runs real containers: Debian's podman with runc (its
# default crun cannot run in cgroup v1/v2 hybrid mode) and catatonit (podman's --init), installed
# once per machine when missing (as root, from Debian's package index). Then the test image, built
# once from an empty rootfs of mount points (podman import; the host's /usr is bind-mounted
# read-only when it runs): tests/integration/containers.py.
PODMAN_STAMP := $(VENV)/.podman
$(PODMAN_STAMP): | $(STAMP)
	@{ command -v podman >/dev/null && test -x /usr/sbin/runc && test -x /usr/libexec/podman/catatonit; } || { \
	  if [ "$$(id -u)" != 0 ]; then echo "the container tests need podman: sudo apt-get install podman runc catatonit" >&2; exit 1; fi; \
	  echo "installing podman, runc and catatonit for the container tests (once)"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq --no-install-recommends podman runc catatonit >/dev/null 2>&1 \
	  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends podman runc catatonit >/dev/null; }; }
	$(BIN)/python -m tests.integration.containers
	@touch $@

# tests/integration/test_cluster_metrics.py runs the Grafana dashboards' queries through a real
# Prometheus server (Debian's, with promtool): installed once per machine when missing (as root, from
# Debian's package index; the index is updated only when the install needs it).
PROMETHEUS_STAMP := $(VENV)/.prometheus
$(PROMETHEUS_STAMP): | $(STAMP)
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  if [ "$$(id -u)" != 0 ]; then echo "the metrics tests need Prometheus: sudo apt-get install prometheus" >&2; exit 1; fi; \
	  echo "installing Prometheus for the metrics tests (once)"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
	  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }; }
	@touch $@

# The main job: small real workloads under the agent, on the local GPUs or (without a driver) the
# simulated fleet; `python` in the manifests is this venv's. Then a model deployment under a burst
# of traffic from the built-in load generator: replicas scale up, then down.
demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(BIN)/gpufrac up examples/quickstart.yaml --until-done
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(BIN)/gpufrac up examples/serving/deployment.yaml --until-done --load 1,12,12,12,1,1,1 --load-step 4

test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy src

unit: $(STAMP) $(CHROMIUM_STAMP) $(TMUX_STAMP) $(PODMAN_STAMP) $(PROMETHEUS_STAMP)
	$(BIN)/pytest -q -m "not gpu" -n 2 --dist loadfile --durations=15

bench: $(STAMP)
	@for b in bench/*.py; do case $$b in bench/gpu_*) continue;; esac; echo "== $$b"; $(BIN)/python $$b || exit 1; done

# On a machine with a GPU, PyTorch and nvidia-ml-py already installed and no network.
gpu-check:
	bash scripts/gpu-check.sh

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis .import_linter_cache .grimp_cache
