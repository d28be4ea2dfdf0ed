# gpufrac: `make demo` and `make test` are the whole set-up (they create .venv on first use).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench gpu-check clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
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

typecheck: $(STAMP)
	$(BIN)/mypy src

unit: $(STAMP)
	$(BIN)/pytest -q -m "not gpu"

bench: $(STAMP)
	@for b in bench/*.py; do case $$b in bench/gpu_*) continue;; esac; echo "== $$b"; $(BIN)/python $$b || exit 1; done

# On a machine with a GPU, PyTorch and nvidia-ml-py already installed and no network.
gpu-check:
	bash scripts/gpu-check.sh

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
