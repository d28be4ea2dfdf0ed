#!/usr/bin/env bash
# GPU tests and GPU benchmarks, on a machine whose python3 already holds PyTorch and nvidia-ml-py and
# that has no network. That python3 is itself a venv, so no new venv: the project and any missing
# dependencies (cp312 wheels in the git-ignored .whl/) go into a --target folder put on PYTHONPATH.
#
#   scripts/gpu-check.sh [--only PART[,PART...]] [--dry-run]
#
# Parts, in this order: tests (pytest -m gpu tests/gpu, less the container part), colocation
# (bench/colocation.py --quick), bench (every bench/gpu_*.py), containers (a PyTorch container
# through gpufrac's CDI spec: tests/gpu/test_container_gpu.py; skipped with the reason where podman
# and runc are not installed). Each part writes $OUT/gpu-check-<part>.json (its exit status and
# time) and $OUT/gpu-check-<part>.log as it finishes, so a timeout keeps what ran. --dry-run needs
# no GPU: it checks every import and collects the tests, runs the co-location benchmark's CPU
# models briefly, and says what the real run would do.
set -uo pipefail
cd "$(dirname "$0")/.."
ALL="tests colocation bench containers"
ONLY=$ALL
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only) ONLY=${2:?--only needs a part: one of $ALL}; ONLY=${ONLY//,/ }; shift 2 ;;
    --only=*) ONLY=${1#--only=}; ONLY=${ONLY//,/ }; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (--only PART[,PART...], --dry-run)" >&2; exit 2 ;;
  esac
done
for part in $ONLY; do
  case " $ALL " in *" $part "*) ;; *) echo "gpu-check: no part '$part': the parts are $ALL" >&2; exit 2 ;; esac
done
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
SITE=${GPUFRAC_SITE:-/tmp/gpufrac-site}
mkdir -p "$SITE"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . \
  || echo "note: could not install the project into $SITE; using src/ directly"
export PYTHONPATH="$PWD/src:$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
export PYTHONUNBUFFERED=1
[ "$DRY" = 1 ] || export GPUFRAC_REQUIRE_GPU=1
# every import the parts need, before any GPU time is spent
python3 - <<'PY' || exit 1
import importlib, sys
need = ["gpufrac", "gpufrac.runtime.agent", "gpufrac.devices.nvml", "pynvml", "pytest", "yaml"]
missing = []
for name in need:
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - report every one
        missing.append(f"{name}: {e}")
for name in ["torch"]:
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001
        print(f"gpu-check: note: {name} is missing ({e}): the workloads that need it skip")
if missing:
    print("gpu-check: missing imports:\n  " + "\n  ".join(missing), file=sys.stderr)
    sys.exit(1)
print("gpu-check: imports ok")
PY
nvidia-smi --query-gpu=name,uuid,mig.mode.current,memory.total --format=csv 2>/dev/null \
  || echo "gpu-check: no nvidia-smi here"
status=0
part() {  # part NAME COMMAND...: run it, its log and a JSON record under $OUT
  local name=$1; shift
  local start=$SECONDS rc=0
  echo "== $name: $*"
  "$@" > >(tee "$OUT/gpu-check-$name.log") 2>&1 || rc=$?
  printf '{"part": "%s", "rc": %d, "seconds": %d, "dry_run": %s, "command": "%s"}\n' \
    "$name" "$rc" "$((SECONDS - start))" "$([ "$DRY" = 1 ] && echo true || echo false)" "$*" \
    > "$OUT/gpu-check-$name.json"
  [ "$rc" = 0 ] || status=$rc
}
collect=(); [ "$DRY" = 1 ] && collect=(--collect-only)
for p in $ALL; do
  case " $ONLY " in *" $p "*) ;; *) continue ;; esac
  case $p in
    tests) part tests python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider \
             --ignore=tests/gpu/test_container_gpu.py "${collect[@]}" ;;
    colocation)
      if [ "$DRY" = 1 ]; then
        part colocation python3 bench/colocation.py --dry-run --window 0.3 --json "$OUT/colocation.json"
      else
        part colocation python3 bench/colocation.py --quick --json "$OUT/colocation.json"
      fi ;;
    bench)
      benches=(bench/gpu_*.py)
      if [ ! -e "${benches[0]}" ]; then echo "== bench: no bench/gpu_*.py"; continue; fi
      for b in "${benches[@]}"; do
        if [ "$DRY" = 1 ]; then part "bench-$(basename "$b" .py)" python3 "$b" --help
        else part "bench-$(basename "$b" .py)" python3 "$b"; fi
      done ;;
    containers) part containers python3 -m pytest -q -m gpu -rs tests/gpu/test_container_gpu.py \
                  -p no:cacheprovider "${collect[@]}" ;;
  esac
done
echo "gpu-check: done (exit $status); records in $OUT"
exit $status
