#!/usr/bin/env bash
# Run a GPU test many times in parallel and dump the native stacks of any run that hangs.
# Source on the GPU host after tools/gpu_setup.sh (gpu_round.sh step "hang"):
#   HANG_TESTS="tests/gpu/test_gpu_conformance_python.py -k state_machine" HANG_WORKERS=8 HANG_ROUNDS=3 \
#   HANG_AFTER=90 bash tools/gpu_hang_probe.sh
# Each run logs to $OUT/hang/w<worker>-r<round>.log; a run still going after HANG_AFTER seconds gets
# `py-spy dump --native` (every thread, Python and C++ frames) into .dump next to its log, then is killed.
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT/hang"
SPY=$(command -v py-spy || echo /tmp/trt-site/bin/py-spy)
run_one() {
  local log="$OUT/hang/w$1-r$2.log"
  python3 -m pytest ${HANG_TESTS:-tests/gpu/test_gpu_conformance_python.py -k state_machine} -q -p no:cacheprovider \
    -p no:randomly --timeout 0 > "$log" 2>&1 &
  local pid=$! waited=0
  while kill -0 $pid 2>/dev/null; do
    sleep 1; waited=$((waited + 1))
    if [ $waited -ge ${HANG_AFTER:-90} ]; then
      "$SPY" dump --native --pid $pid > "${log%.log}.dump" 2>&1
      echo "HUNG after ${waited}s: dumped" >> "$log"; kill -9 $pid; break
    fi
  done
  wait $pid 2>/dev/null
  echo "run w$1-r$2: $(tail -1 "$log")"
}
for w in $(seq 1 ${HANG_WORKERS:-8}); do
  ( for r in $(seq 1 ${HANG_ROUNDS:-3}); do run_one $w $r; done ) &
done
wait
echo "hang probe: $(grep -l HUNG "$OUT"/hang/*.log 2>/dev/null | wc -l) hung of $(ls "$OUT"/hang/*.log | wc -l) runs"
