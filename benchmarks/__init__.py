"""trt-runtime's benchmarks: every row on every workload in one run, on top of :mod:`trt_runtime.bench`.

Modules: :mod:`.workloads` (the engines), :mod:`.rows` (what each row calls; set up in
:mod:`.raw_rows`, :mod:`.backend_rows`, :mod:`.torch_tensorrt_rows`), :mod:`.runner`
(interleaved measurement), :mod:`.targets` (ratios and the per-call overhead targets),
:mod:`.cold_warm` (runtime cache in fresh processes), :mod:`.report` (JSON, Markdown,
plot), :mod:`.environment` and :mod:`.device`, and :mod:`.cli`, the entry point of
``python -m benchmarks`` and ``python benchmarks/bench_all.py``. See docs/benchmarks.md.

:mod:`.bench_concurrency` (``python -m benchmarks.bench_concurrency``) measures concurrent
callers x execution contexts, with :mod:`.concurrency_grid` (rows, measurement, targets)
and :mod:`.concurrency_callers` (what a caller thread does); see docs/concurrency.md.
"""
