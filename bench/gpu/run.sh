#!/usr/bin/env bash
# The one script to run on a GPU device machine (one CUDA device, torch preinstalled, no network):
# installs the carried NIXL wheel, runs pdworker's worker suite on CUDA and the GPU KV benchmark,
# and leaves everything under $OUT. See bench/gpu/README.md.
#
#   bench/gpu/run.sh                         # tests, then the benchmark (default phases)
#   bench/gpu/run.sh --phase bench           # only the benchmark (fits one device lease)
#   bench/gpu/run.sh --device cpu --quick    # the CPU check of this script (any machine)
#
# Options: --device cuda|cpu (default cuda), --phase tests|bench|storm|all (repeatable; default
# tests+bench), --quick (quick benchmark sizes), --wheels DIR (default $NIXL_WHEELS or
# shared/wheels), --tests-timeout S (default 240), --tests-mark EXPR (pytest -m, e.g. gpu).
# Environment: OUT (results; default
# /tmp/pdw-gpu-out), PYTHON (default python3), PDW_SITE (install target, default /tmp/site).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
DEVICE=cuda QUICK="" PHASES="" TESTS_TIMEOUT=240 TESTS_MARK=""
WHEELS=${NIXL_WHEELS:-shared/wheels}
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --phase) PHASES="$PHASES $2"; shift 2 ;;
    --quick) QUICK=--quick; shift ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --tests-timeout) TESTS_TIMEOUT=$2; shift 2 ;;
    --tests-mark) TESTS_MARK=$2; shift 2 ;;
    *) echo "run.sh: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
PHASES=${PHASES:-" tests bench"}
OUT=${OUT:-/tmp/pdw-gpu-out}
PY=${PYTHON:-python3}
SITE=${PDW_SITE:-/tmp/site}
mkdir -p "$OUT" "$SITE"
log() { echo "[run.sh $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }
export PYTHONPATH="$SITE:$PWD/worker:$PWD/operator:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

# 1. NIXL: the build matching torch's CUDA and this Python (cp3XY), from the carried wheel
# folder (never the network).
cuda=$("$PY" -c "import torch; print((torch.version.cuda or '').split('.')[0])" 2>>"$OUT/run.log")
pytag=$("$PY" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
if ! "$PY" -c "from pdworker.nixl_loader import load_nixl; load_nixl()" 2>/dev/null; then
  wheel=""
  # name-version-pythontag-abitag-platform.whl: the Python tag must be this interpreter's.
  for pattern in "nixl_cu${cuda}-*-${pytag}-*.whl" "nixl_cu*-*-${pytag}-*.whl"; do
    wheel=$(ls "$WHEELS"/$pattern 2>/dev/null | head -n 1)
    [ -n "$wheel" ] && break
  done
  if [ -z "$wheel" ]; then
    others=$(cd "$WHEELS" 2>/dev/null && ls nixl_cu*-*.whl 2>/dev/null | tr '\n' ' ')
    if [ -n "$others" ]; then
      log "no NIXL importable; $WHEELS holds NIXL wheels only for another Python: ${others% }" \
        "(this is $("$PY" -V 2>&1), tag $pytag; carry the ${pytag} wheel)"
    else
      log "no NIXL importable and no nixl_cu*-${pytag}-*.whl in $WHEELS" \
        "(torch CUDA major: ${cuda:-none})"
    fi
    exit 3
  fi
  if "$PY" -m pip --version >/dev/null 2>&1; then
    log "installing $wheel into $SITE (pip)"
    "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" "$wheel" \
      >>"$OUT/run.log" 2>&1 || { log "pip install of $wheel failed"; exit 3; }
  else
    # No pip on this Python: a wheel is a zip of the files as they lie in site-packages, and
    # NIXL's bundled libraries find each other through relative RPATHs, so unpacking works.
    log "no pip for $PY: unpacking $wheel into $SITE (python -m zipfile)"
    "$PY" -m zipfile -e "$wheel" "$SITE" >>"$OUT/run.log" 2>&1 \
      || { log "unpacking $wheel failed"; exit 3; }
  fi
  if ! "$PY" -c "from pdworker.nixl_loader import load_nixl; load_nixl()" >>"$OUT/run.log" 2>&1; then
    log "NIXL still not importable after installing $wheel (see the traceback above)"; exit 3
  fi
fi
# 2. Everything else pdworker and its tests import must already be there (or be carried as wheels).
missing=$("$PY" - <<'PYEOF'
import importlib.util
need = ["torch", "numpy", "aiohttp", "prometheus_client", "pytest", "hypothesis"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$missing" ]; then
  log "missing modules: $missing; trying wheels from $WHEELS"
  "$PY" -m pip --version >/dev/null 2>&1 \
    || { log "no pip for $PY to install $missing (their dependencies need a resolver)"; exit 3; }
  # shellcheck disable=SC2086
  "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" --target "$SITE" $missing \
    >>"$OUT/run.log" 2>&1 || { log "cannot install: $missing"; exit 3; }
fi
{
  echo "date: $(date -u +%FT%TZ)"; echo "device: $DEVICE"; echo "phases:$PHASES"
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); print('gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"
  "$PY" -c "from pdworker.nixl_loader import load_nixl; print('nixl module', load_nixl().module)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} >"$OUT/env.txt" 2>&1
log "$(tr '\n' ';' <"$OUT/env.txt")"
if [ "$DEVICE" != cpu ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  log "--device $DEVICE but torch sees no CUDA device"; exit 4
fi

# Worker processes the tests start (bench/harness.py: start_new_session=True, so a signal to
# pytest's process group does not reach them) outlive a pytest that could not tear its fixtures
# down, and would skew the phases after it. Every process the tests phase starts inherits
# PDW_GPU_RUN=<this run's id> in its environment, which no other process carries: after the
# phase, any process whose environment (/proc/PID/environ, readable for our own processes) holds
# exactly that entry is a leftover of this run and is ended. Matching names (pdworker.cli) would
# also hit another run's or a user's workers; the harness's pid list dies with pytest.
RUN_ID="$$-$(date +%s%N)"
run_pids() {  # processes whose environment holds this run's PDW_GPU_RUN entry
  local p
  for p in /proc/[0-9]*; do
    tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF "PDW_GPU_RUN=$RUN_ID" && echo "${p#/proc/}"
  done
}
reap_run() {
  local pids p
  pids=$(run_pids | tr '\n' ' ')
  [ -z "$pids" ] && return 0
  log "tests left processes behind, ending them: $pids"
  for p in $pids; do log "  $p: $(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | cut -c1-160)"; done
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null
  for _ in 1 2 3 4 5 6; do
    [ -z "$(run_pids)" ] && return 0
    sleep 0.5
  done
  pids=$(run_pids | tr '\n' ' ')  # only those still carrying the mark: no reused pid is hit
  log "still running after SIGTERM, SIGKILL: $pids"
  # shellcheck disable=SC2086
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  return 0
}

rc=0
for phase in $PHASES; do
  case "$phase" in
    tests)
      # The worker suite; its workers' --device auto picks CUDA when present. --confcutdir keeps
      # the repository's cluster fixtures (kubernetes tooling) out of this run.
      # On timeout SIGINT (pytest unwinds as on Ctrl-C: fixtures stop their workers), and
      # SIGKILL 30 s later if it still runs; reap_run catches what survives either way.
      log "tests: tests/worker on $DEVICE (timeout ${TESTS_TIMEOUT}s)"
      PDW_GPU_RUN="$RUN_ID" timeout -s INT -k 30 "$TESTS_TIMEOUT" \
        "$PY" -m pytest tests/worker --confcutdir tests/worker \
        -p no:cacheprovider -q -rA -o addopts="" --strict-markers ${TESTS_MARK:+-m "$TESTS_MARK"} \
        --junitxml "$OUT/tests-worker.xml" >"$OUT/tests-worker.log" 2>&1
      t=$?; log "tests rc=$t: $(tail -n 1 "$OUT/tests-worker.log")"; [ $t -ne 0 ] && rc=$t
      [ $t -eq 124 ] && log "tests hit the ${TESTS_TIMEOUT}s timeout (SIGINT sent)"
      reap_run ;;
    bench)
      log "bench: kv_transfer --device $DEVICE $QUICK"
      "$PY" -m bench.kv_transfer --device "$DEVICE" $QUICK --out "$OUT/results" \
        --readme "$OUT/results/README-rows.md" >"$OUT/bench-kv_transfer.log" 2>&1
      t=$?; log "bench rc=$t"; [ $t -ne 0 ] && rc=$t ;;
    storm)
      log "storm: kv_storm --device $DEVICE $QUICK"
      "$PY" -m bench.kv_storm --device "$DEVICE" $QUICK --out "$OUT/results" \
        --readme "$OUT/results/README-rows.md" >"$OUT/bench-kv_storm.log" 2>&1
      t=$?; log "storm rc=$t"; [ $t -ne 0 ] && rc=$t ;;
    *) log "unknown phase $phase"; rc=2 ;;
  esac
done
log "done rc=$rc; results under $OUT"
exit $rc
