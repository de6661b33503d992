#!/usr/bin/env bash
# Device check on a GPU machine: kernel correctness at real shapes, calibration, then trace replay.
#
# Needs: python3 with torch, triton, numpy, typer, rich (no simpy, no network, kvsim not installed);
# the repository root as the working directory; $OUT an output folder. Writes there:
#   device_check.log (steps and exit codes), versions.txt, check.log, calibrate.log,
#   calibration-<gpu>.json, replay-<case>.log/.json, check-hybrid.log, bench-hybrid.log/.json
#   (and replay-alpaca-300-gpt-oss-20b-h200.log/.json with STEPS=hybrid).
# STEPS picks the parts (default "base"; "base hybrid" for both):
#   base   = check --full of the full-attention kernels, calibrate, two replays (under 8 minutes:
#            check <= 200 s, calibrate <= 180 s or a --quick retry, two replays <= 60 s each);
#   hybrid = check --full of the sliding-window, chunked-local and MLA kernels (<= 150 s),
#            bench-hybrid (<= 90 s) and a replay of a hybrid model (gpt-oss-20b: one block table per
#            KV cache group, <= 180 s); hybrid times on a GPU not yet measured.
# Where one command may run 10 minutes at most, run them as two: STEPS=base, then STEPS=hybrid.
set -uo pipefail
STEPS="${STEPS:-base}"
want() { case " $STEPS " in *" $1 "*) return 0;; *) return 1;; esac; }
: "${OUT:?set OUT to an output folder}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export COLUMNS=200  # wide rich tables in the logs
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/device_check.log"; }

log "start in $PWD"
"$PY" - >"$OUT/versions.txt" 2>&1 <<'PYEOF'
import platform, sys, torch, triton
import gpu_harness.calibrate, gpu_harness.check, gpu_harness.cli, gpu_harness.kernels, gpu_harness.replay
import gpu_harness.bench_hybrid, gpu_harness.check_hybrid
import gpu_harness.bench_hybrid, gpu_harness.check_hybrid
assert "simpy" not in sys.modules, "the harness imported simpy"
print("python", platform.python_version(), "torch", torch.__version__, "triton", triton.__version__)
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("device", torch.cuda.get_device_name())
PYEOF
rc=$?; cat "$OUT/versions.txt" | tee -a "$OUT/device_check.log"
if [ $rc -ne 0 ]; then log "environment check failed ($rc)"; exit 2; fi

GPU=$("$PY" -c "import torch; from gpu_harness.bench import guess_gpu_preset as g; n = torch.cuda.get_device_name(); print(g(n) or n.lower().replace(' ', '-'))")
log "gpu preset: $GPU"

check_rc=0; hybrid_rc=0; cal_rc=0; replay_rc=0
# Hybrid-model kernels (issue 23): sliding-window decode (gpt-oss W=128, Gemma 3 W=1024) and chunked
# local decode (Llama 4 Scout, chunks of 8192) over tables with null entries, MLA decode (DeepSeek-V3:
# rank 512 + rope 64, 128 and 16 heads).
if want hybrid; then
  log "check --full --grid hybrid"
  timeout 150 "$PY" -m gpu_harness check --full --grid hybrid >"$OUT/check-hybrid.log" 2>&1
  hybrid_rc=$?; tail -n 3 "$OUT/check-hybrid.log" | tee -a "$OUT/device_check.log"; log "check hybrid exit $hybrid_rc"
  log "bench-hybrid"
  timeout 90 "$PY" -m gpu_harness bench-hybrid --out "$OUT/bench-hybrid.json" >"$OUT/bench-hybrid.log" 2>&1
  rc=$?; tail -n 22 "$OUT/bench-hybrid.log" | tee -a "$OUT/device_check.log"; log "bench-hybrid exit $rc"
  [ $rc -ne 0 ] && hybrid_rc=$rc
  # Trace replay of gpt-oss-20b (sliding W=128 + full groups, 2 layers of each) through kvsim's hybrid
  # allocator, blocks checked against kvsim's shipped prediction (made as for the base replays below).
  for case in "alpaca-300-gpt-oss-20b-h200:"; do
    name=${case%%:*}; flags=${case#*:}
    log "replay $name"
    # shellcheck disable=SC2086
    timeout 180 "$PY" -m gpu_harness replay traces/alpaca_30rps_2min.jsonl --model gpt-oss-20b --gpu h200 \
      --max-requests 300 --layers 2 --check-every 20 --engine-profile ideal $flags \
      --expect "gpu_harness/expected/$name.csv" --json "$OUT/replay-$name.json" >"$OUT/replay-$name.log" 2>&1
    rc=$?; tail -n 14 "$OUT/replay-$name.log" | tee -a "$OUT/device_check.log"; log "replay $name exit $rc"
    [ $rc -ne 0 ] && hybrid_rc=$rc
  done
fi
if ! want base; then log "done"; [ $hybrid_rc -eq 0 ]; exit $?; fi

log "check --full --grid base"
timeout 200 "$PY" -m gpu_harness check --full --grid base >"$OUT/check.log" 2>&1
check_rc=$?; tail -n 3 "$OUT/check.log" | tee -a "$OUT/device_check.log"; log "check exit $check_rc"

log "calibrate"
timeout 180 "$PY" -m gpu_harness calibrate --out "$OUT/calibration-$GPU.json" >"$OUT/calibrate.log" 2>&1
cal_rc=$?; tail -n 12 "$OUT/calibrate.log" | tee -a "$OUT/device_check.log"; log "calibrate exit $cal_rc"
if [ $cal_rc -eq 124 ]; then
  log "calibrate timed out; retrying with --quick"
  timeout 90 "$PY" -m gpu_harness calibrate --quick --out "$OUT/calibration-$GPU-quick.json" \
    >"$OUT/calibrate-quick.log" 2>&1
  cal_rc=$?; tail -n 12 "$OUT/calibrate-quick.log" | tee -a "$OUT/device_check.log"; log "calibrate --quick exit $cal_rc"
fi

# Trace replay at the real Llama-3-8B shape (2 layers), blocks checked against kvsim's shipped
# prediction (gpu_harness/expected/, made by `kvsim run ... --engine-profile ideal --out` then `cut -d, -f1,8 steps.csv`).
for case in "alpaca-300-llama-3-8b-h200:" "alpaca-300-llama-3-8b-h200-48blocks-swap:--num-blocks 48 --preemption swap"; do
  name=${case%%:*}; flags=${case#*:}
  log "replay $name"
  # shellcheck disable=SC2086
  timeout 60 "$PY" -m gpu_harness replay traces/alpaca_30rps_2min.jsonl --model llama-3-8b --gpu h200 \
    --max-requests 300 --layers 2 --check-every 20 --engine-profile ideal $flags --expect "gpu_harness/expected/$name.csv" \
    --json "$OUT/replay-$name.json" >"$OUT/replay-$name.log" 2>&1
  rc=$?; tail -n 14 "$OUT/replay-$name.log" | tee -a "$OUT/device_check.log"; log "replay $name exit $rc"
  [ $rc -ne 0 ] && replay_rc=$rc
done

log "done"
[ $check_rc -eq 0 ] && [ $hybrid_rc -eq 0 ] && [ $cal_rc -eq 0 ] && [ $replay_rc -eq 0 ]
