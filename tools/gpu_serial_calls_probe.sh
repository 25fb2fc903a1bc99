# GPU host: bench_concurrency with and without TRT_RUNTIME_SERIAL_CALLS=1, interleaved (off, on, off, on),
# python and torchbind on tiny and mlp, callers 1 and 8, contexts 1 and 8; prints calls/s side by side.
# Usage (after the staged stack's install.sh): bash tools/gpu_serial_calls_probe.sh
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
args=(--backend python,torchbind --workloads tiny,mlp --callers 1,8 --contexts 1,8 --duration 0.4 --warmup 0.1 --no-plot)
for run in off1 on1 off2 on2; do
  case $run in on*) export TRT_RUNTIME_SERIAL_CALLS=1 ;; *) unset TRT_RUNTIME_SERIAL_CALLS ;; esac
  python3 -m benchmarks.bench_concurrency --out "$OUT/serial-$run" "${args[@]}" > "$OUT/serial-$run.log" 2>&1 || echo "run $run failed"
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
runs = {r: {(x["backend"], x["workload"], x["mode"], x["callers"], x["contexts"]): x for x in
            json.load(open(f"{out}/serial-{r}/bench_concurrency.json"))["rows"]} for r in ("off1", "on1", "off2", "on2")}
print(f"{'row':38} {'off1':>8} {'on1':>8} {'off2':>8} {'on2':>8}  wrong/errors")
for key in runs["off1"]:
    cells = [runs[r].get(key, {}) for r in runs]
    cps = [c.get("calls_per_s") or 0 for c in cells]
    bad = sum((c.get("wrong") or 0) + (c.get("errors") or 0) for c in cells)
    print(f"{'/'.join(map(str, key)):38} " + " ".join(f"{v:8.0f}" for v in cps) + f"  {bad}")
PY
