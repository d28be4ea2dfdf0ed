#!/usr/bin/env bash
# GPU tests and GPU benchmarks, on a machine whose python3 already holds PyTorch and nvidia-ml-py and
# that has no network. That python3 is itself a venv, so no new venv: the project and any missing
# dependencies (cp312 wheels in the git-ignored .whl/) go into a --target folder put on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${GPUFRAC_SITE:-/tmp/gpufrac-site}
mkdir -p "$SITE"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . \
  || echo "note: could not install the project into $SITE; using src/ directly"
export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
export PYTHONUNBUFFERED=1 GPUFRAC_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,uuid,mig.mode.current,memory.total --format=csv || true
status=0
python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider || status=$?
# the QoS co-location benchmark, quick mode (< 3 minutes on an H200); JSON next to the output
echo "== bench/colocation.py --quick"
python3 bench/colocation.py --quick --json "${OUT:-/tmp}/colocation.json" || status=$?
for b in bench/gpu_*.py; do
  [ -e "$b" ] || continue
  echo "== $b"
  python3 "$b" || status=$?
done
exit $status
