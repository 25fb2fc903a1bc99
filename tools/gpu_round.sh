# Source on the GPU host, after the staged stack's install.sh (see ../shared/gpu/stage.sh):
#   source .gpu/p18/install.sh && source tools/gpu_round.sh STEP [STEP ...]
# (Do not pipe that line: a pipe runs it in a subshell, and the commands after it lose the installed
# checkout on PYTHONPATH. Give later work its own step, or `source tools/gpu_setup.sh` again.)
# Installs this checkout (and the wheels in .whl/) via tools/gpu_setup.sh, then runs each STEP,
# logging to $OUT/STEP.log. Steps: env, suite (SUITE_WORKERS xdist workers, default 8; cut at SUITE_LIMIT s, default 520;
# a test past 120 s has its stacks dumped and its worker killed, so a native hang is named too; its
# last lines name the failed tests, tools/gpu_suite_summary.py), suite3 (the suite SUITE3_RUNS times, default three, each a fresh pytest
# cut at SUITE3_LIMIT s, default 180: per run its counts and failed tests, then the total wall time), suite-python (python backend only), bench,
# concurrency, serve, onnx, race (torchbind threads probe, under three GPU-burning processes), shapes (shape-switch probe), exit (tools/gpu_exit_matrix.py: the exit matrix, each scenario in its own process), exitprobe (benchmarks/probes/gpu_exit_abort_probe.py: the daemon-thread exit scenario and its one-hypothesis variants, EXITPROBE_ARGS), churn (outer-graph captures with and without cudaGraphExecUpdate), steps (benchmarks/probes/gpu_step_costs.py, STEPS_ARGS), floor (benchmarks/probes/gpu_floor_probe.py, FLOOR_ARGS), graphrace (benchmarks/probes/gpu_graph_race_probe.py on GRAPHRACE_WORKLOADS, GRAPHRACE_ARGS), layerrace (the same on one-layer engines, LAYERRACE_LAYERS), gil (benchmarks/probes/gpu_gil_probe.py, GIL_ARGS), soak (the 10,000 load/call/close cycles per backend, the two backends side by side, apart from the suite; TRT_RUNTIME_FAULT_CYCLES; SOAK_BACKEND=python or torchbind runs one; progress every 500 cycles in $OUT/soak-progress.log; a shared runtime cache unless TRT_RUNTIME_SOAK_CACHE=none), soak2 (the same on a 2-GPU host: python on GPU 0 and torchbind on GPU 1 at once, each cut at SOAK_LIMIT s), cycles (benchmarks/probes/gpu_load_cycles.py, CYCLES_ARGS), batchshapes (benchmarks/probes/gpu_batch_shapes.py: the local server's batched engine call by row count), balance (benchmarks/probes/cpu_front_balance.py: how the fronts share 64 keep-alive connections, handed out in turn and from the shared socket, BALANCE_ARGS), wakeup (benchmarks/probes/cpu_wakeup.py: a unix-socket round trip to a process that sleeps or polls, WAKEUP_ARGS), hang (tools/gpu_hang_probe.sh: a test run many times, native stacks of a hung run), and pack (last: everything under $OUT into one gpu-round.tgz, since
# only 8 files come back). A failed step is reported and the next one still runs.
source tools/gpu_setup.sh
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
_gpu_suite_args=(-m "gpu and not soak" tests/gpu tests/cli/test_cli_demo.py tests/formats/test_formats_pte.py tests/formats/test_executorch_interop.py
                 -rfEs -q -p no:cacheprovider --timeout 300)
# One run of the GPU suite (steps suite, suite3): LIMIT LOG JUNIT. At LIMIT s pytest gets SIGINT, so it still
# prints its summary and writes the junit XML (KILL 30 s later); each test at most 120 s; -vv (with the -q above:
# one line per test) so that a run killed before its summary still names its failed tests in LOG.
_gpu_suite_once() {
  timeout -s INT -k 30 "$1" python3 -m pytest "${_gpu_suite_args[@]}" -n "${SUITE_WORKERS:-8}" -vv --timeout 120 --timeout-method thread --junitxml "$3" > "$2" 2>&1
  local rc=$?
  [ "$rc" -eq 124 ] && echo "gpu_round: the suite was cut at $1 s" | tee -a "$2"
  return "$rc"
}
for step in "$@"; do
  t0=$(date +%s)
  case "$step" in
    env) { date -u; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv;
           python3 -c "import sys, torch, tensorrt_rtx as t; print(sys.version.split()[0], 'torch', torch.__version__, 'tensorrt_rtx', t.__version__)";
           python3 -c "import torch_tensorrt as tt; print('torch_tensorrt', tt.__version__)" 2>&1 | tail -1; } 2>&1 | tee "$OUT/env.log" ;;
    suite) _gpu_suite_once "${SUITE_LIMIT:-520}" "$OUT/suite.log" "$OUT/junit.xml"; tail -60 "$OUT/suite.log"
           python3 tools/gpu_suite_summary.py "$OUT/suite.log" --label suite ;;
    suite3) _t3=$(date +%s)
            for _n in $(seq "${SUITE3_RUNS:-3}"); do
              _gpu_suite_once "${SUITE3_LIMIT:-180}" "$OUT/suite3-$_n.log" "$OUT/junit3-$_n.xml"
              python3 tools/gpu_suite_summary.py "$OUT/suite3-$_n.log" --label "run $_n"
            done 2>&1 | tee "$OUT/suite3.log"
            echo "suite3: ${SUITE3_RUNS:-3} runs in $(( $(date +%s) - _t3 )) s" | tee -a "$OUT/suite3.log" ;;
    soak) TRT_RUNTIME_SOAK_LOG="$OUT/soak-progress.log" python3 -m pytest -m soak tests/gpu -rfEs -q -p no:cacheprovider \
            -n 2 --timeout 570 ${SOAK_BACKEND:+-k "$SOAK_BACKEND"} 2>&1 | tee "$OUT/soak.log" | tail -30
          tail -4 "$OUT/soak-progress.log" 2>/dev/null ;;
    soak2) # the two backends' soaks at once, each alone on a GPU of its own (device memory is read device-wide)
           for _i in 0 1; do _b=$([ "$_i" = 0 ] && echo python || echo torchbind)
             CUDA_VISIBLE_DEVICES=$_i TRT_RUNTIME_SOAK_LOG="$OUT/soak-progress-$_b.log" timeout -s INT -k 20 "${SOAK_LIMIT:-560}" \
               python3 -m pytest -m soak tests/gpu -rfEs -q -p no:cacheprovider -k "$_b" --timeout 600 > "$OUT/soak-$_b.log" 2>&1 &
           done; wait
           for _b in python torchbind; do echo "== $_b"; tail -8 "$OUT/soak-$_b.log"; tail -3 "$OUT/soak-progress-$_b.log" 2>/dev/null; done ;;
    suite-python) TRT_RUNTIME_BACKEND=python python3 -m pytest "${_gpu_suite_args[@]}" -n 4 -k "not torchbind" 2>&1 | tee "$OUT/suite-python.log" | tail -60 ;;
    bench) python3 benchmarks/bench_all.py --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -80 ;;
    concurrency) python3 -m benchmarks.bench_concurrency --out "$OUT/concurrency" ${CONC_ARGS:-} 2>&1 | tee "$OUT/concurrency.log" | tail -80 ;;
    serve) python3 benchmarks/bench_serve.py --out "$OUT/serve" ${SERVE_ARGS:-} 2>&1 | tee "$OUT/serve.log" | tail -80 ;;
    cycles) python3 benchmarks/probes/gpu_load_cycles.py --out "$OUT/cycles" ${CYCLES_ARGS:-} 2>&1 | tee "$OUT/cycles.log" | tail -10 ;;
    batchshapes) python3 benchmarks/probes/gpu_batch_shapes.py --out "$OUT/batch_shapes" 2>&1 | tee "$OUT/batch_shapes.log" | tail -12 ;;
    balance) python3 benchmarks/probes/cpu_front_balance.py ${BALANCE_ARGS:-} 2>&1 | tee "$OUT/balance.log" | tail -12 ;;
    wakeup) python3 benchmarks/probes/cpu_wakeup.py --out "$OUT/wakeup.json" ${WAKEUP_ARGS:-} 2>&1 | tee "$OUT/wakeup.log" | tail -8 ;;
    onnx) python3 benchmarks/probes/gpu_onnx_compare.py --out "$OUT/onnx" 2>&1 | tee "$OUT/onnx.log" | tail -40 ;;
    race) # under GPU load: three matmul processes (tools/gpu_burn.py, 150 s each) beside the probe
          _burns=(); for _i in 1 2 3; do python3 tools/gpu_burn.py & _burns+=($!); done; sleep 5
          python3 benchmarks/probes/gpu_torchbind_race_probe.py --out "$OUT" 2>&1 | tee "$OUT/race.log" | tail -20
          kill "${_burns[@]}" 2>/dev/null; wait "${_burns[@]}" 2>/dev/null ;;
    exit) python3 tools/gpu_exit_matrix.py --out "$OUT/exit" --jobs 8 2>&1 | tee "$OUT/exit.log" | tail -60 ;;
    churn) python3 benchmarks/probes/gpu_graph_churn.py --out "$OUT/churn" 2>&1 | tee "$OUT/churn.log" | tail -10 ;;
    steps) python3 benchmarks/probes/gpu_step_costs.py --out "$OUT/steps" ${STEPS_ARGS:-} 2>&1 | tee "$OUT/steps.log" | tail -60 ;;
    floor) python3 benchmarks/probes/gpu_floor_probe.py --out "$OUT/floor" ${FLOOR_ARGS:-} 2>&1 | tee "$OUT/floor.log" | tail -30 ;;
    gil) python3 benchmarks/probes/gpu_gil_probe.py --out "$OUT/gil" ${GIL_ARGS:-} 2>&1 | tee "$OUT/gil.log" | tail -80 ;;
    graphrace) for _w in ${GRAPHRACE_WORKLOADS:-convnet mlp}; do echo "== $_w";
                 python3 benchmarks/probes/gpu_graph_race_probe.py --workload "$_w" --out "$OUT/graphrace-$_w" ${GRAPHRACE_ARGS:-}; done 2>&1 | tee "$OUT/graphrace.log" | tail -30 ;;
    layerrace) for _l in ${LAYERRACE_LAYERS:-stem conv3 conv3s2 proj conv3late maxpool gap fc}; do echo "== $_l";
                 python3 benchmarks/probes/gpu_graph_race_probe.py --layer "$_l" --modes eager-gated,graphs-gated,graphs-streams \
                   --out "$OUT/layerrace-$_l" ${LAYERRACE_ARGS:-}; done 2>&1 | tee "$OUT/layerrace.log" | grep -v "^  build" | tail -40 ;;
    exitprobe) timeout 150 python3 benchmarks/probes/gpu_exit_abort_probe.py --out "$OUT/exitprobe" ${EXITPROBE_ARGS:---n 8 --jobs 16} 2>&1 | tee "$OUT/exitprobe.log" | tail -40 ;;
    hang) bash tools/gpu_hang_probe.sh 2>&1 | tee "$OUT/hang.log" | tail -40 ;;
    shapes) python3 benchmarks/probes/gpu_shape_switch_probe.py --out "$OUT/shape_switch.json" 2>&1 | tee "$OUT/shapes.log" | tail -30 ;;
    pack) (cd "$OUT" && tar czf /tmp/gpu-round.tgz --exclude gpu-round.tgz . && rm -rf ./* && mv /tmp/gpu-round.tgz .) ;;
    *) echo "gpu_round: unknown step $step (env suite suite3 soak soak2 cycles batchshapes balance wakeup suite-python bench concurrency serve onnx race shapes exit exitprobe churn steps floor graphrace layerrace gil hang pack)" ;;
  esac
  echo "gpu_round: step $step took $(( $(date +%s) - t0 )) s"
done
