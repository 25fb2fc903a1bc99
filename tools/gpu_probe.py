"""One-off GPU probe of TensorRT-RTX runtime facts (cache merge, graphs, allocator)."""
import time, sys, os, json
import numpy as np
import tensorrt_rtx as trt
from cuda.bindings import runtime as cudart, driver as cu
from cuda.core import Device

out = {}
L = trt.Logger(trt.Logger.WARNING)
dev = Device(0); dev.set_current()
out["cc"] = dev.compute_capability; out["name"] = dev.name
err, drv = cudart.cudaDriverGetVersion(); out["driver"] = drv
print("device", dev.name, dev.compute_capability, "driver", drv, "trt", trt.__version__)

def build_mlp(width=256, layers=8, dyn=False, dtype=trt.float16):
    b = trt.Builder(L); n = b.create_network(0)
    x = n.add_input("x", dtype, (-1 if dyn else 8, width)); t = x
    rng = np.random.default_rng(0)
    for i in range(layers):
        w = n.add_constant((width, width), trt.Weights((rng.standard_normal((width, width)) / 16).astype(np.float16 if dtype == trt.float16 else np.float32)))
        t = n.add_matrix_multiply(t, trt.MatrixOperation.NONE, w.get_output(0), trt.MatrixOperation.NONE).get_output(0)
        t = n.add_activation(t, trt.ActivationType.RELU).get_output(0)
    t.name = "y"; n.mark_output(t)
    c = b.create_builder_config()
    if dyn:
        p = b.create_optimization_profile(); p.set_shape("x", (1, width), (8, width), (64, width)); c.add_optimization_profile(p)
    return bytes(b.build_serialized_network(n, c))

def build_nonzero():
    for dt, shape in ((trt.float32, (4, 4)), (trt.int32, (16,)), (trt.int32, (4, 4)), (trt.bool, (4, 4)), (trt.float16, (4, 4))):
        b = trt.Builder(L); n = b.create_network(0)
        x = n.add_input("x", dt, shape)
        nz = n.add_non_zero(x); nz.get_output(0).name = "idx"; n.mark_output(nz.get_output(0))
        s = b.build_serialized_network(n, b.create_builder_config())
        print("nonzero", dt, shape, s is not None)
        if s is not None and dt == trt.float32:
            return bytes(s)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    for variant in ("st_plain", "st_ew", "ew"):
        b = trt.Builder(L); n = b.create_network(flags if variant.startswith("st") else 0)
        x = n.add_input("x", trt.float32, (4, 4)); t = x
        if "ew" in variant:
            t = n.add_elementwise(x, x, trt.ElementWiseOperation.SUM).get_output(0)
        nz = n.add_non_zero(t); nz.get_output(0).name = "idx"; n.mark_output(nz.get_output(0))
        s = b.build_serialized_network(n, b.create_builder_config()); print("nonzero", variant, s is not None)
        if s is not None: return bytes(s)
    return None

t0 = time.perf_counter(); plan = build_mlp(dyn=True); out["build_s"] = time.perf_counter() - t0
rt = trt.Runtime(L)
eng = rt.deserialize_cuda_engine(plan)
names = [eng.get_tensor_name(i) for i in range(eng.num_io_tensors)]
out["io"] = [(nm, str(eng.get_tensor_dtype(nm)), tuple(eng.get_tensor_shape(nm)), str(eng.get_tensor_mode(nm))) for nm in names]
print(out["io"])

stream = dev.create_stream()
sh = int(stream.handle)
def run_with(cfg_mod=None, cache=None, iters=3, batch=8):
    cfg = eng.create_runtime_config()
    if cfg_mod: cfg_mod(cfg)
    if cache is not None: cfg.set_runtime_cache(cache)
    t = time.perf_counter()
    ctx = eng.create_execution_context(cfg)
    t_ctx = time.perf_counter() - t
    x = dev.allocate(batch * 256 * 2, stream=stream); y = dev.allocate(batch * 256 * 2, stream=stream)
    ctx.set_input_shape("x", (batch, 256))
    ctx.set_tensor_address("x", int(x.handle)); ctx.set_tensor_address("y", int(y.handle))
    times = []
    for i in range(iters):
        t = time.perf_counter(); ok = ctx.execute_async_v3(sh); stream.sync(); times.append(time.perf_counter() - t)
        if not ok: times.append("FAIL")
    return cfg, ctx, t_ctx, times

# 1. cold vs warm cache
cfg, ctx, tctx, times = run_with()
cache = cfg.create_runtime_cache()
out["cache_type"] = str(type(cache))
cfg2, ctx2, tctx2, times2 = run_with(cache=cache)
blob = bytes(cache.serialize())
out["cold_first_s"] = times2[0]; out["cache_bytes"] = len(blob)
print("cold", times2[:2], "cache", len(blob))
# fresh cache loaded from blob
c3cfg = eng.create_runtime_config(); cache3 = c3cfg.create_runtime_cache(); ok = cache3.deserialize(blob)
out["deserialize_ret"] = repr(ok)
_, _, _, times3 = run_with(cache=cache3)
out["warm_first_s"] = times3[0]; print("warm", times3[:2])

# 2. merge semantics: cache A has batch 8 kernels (LAZY); cache B has batch 4; deserialize B into A
cfgA = eng.create_runtime_config(); cA = cfgA.create_runtime_cache()
run_with(cache=cA, batch=8); a_bytes = bytes(cA.serialize())
cfgB = eng.create_runtime_config(); cB = cfgB.create_runtime_cache()
run_with(cache=cB, batch=3); b_bytes = bytes(cB.serialize())
cA.deserialize(b_bytes); merged = bytes(cA.serialize())
out["merge"] = dict(a=len(a_bytes), b=len(b_bytes), after=len(merged))
print("merge", out["merge"])
# do both shapes run warm on merged?
cfgM = eng.create_runtime_config(); cM = cfgM.create_runtime_cache(); cM.deserialize(merged)
_, _, _, t8 = run_with(cache=cM, batch=8, iters=1); _, _, _, t3 = run_with(cache=cM, batch=3, iters=1)
out["merged_first"] = dict(b8=t8[0], b3=t3[0])
# deserialize bad bytes
try:
    r = cM.deserialize(b"garbage" * 10); out["bad_deser"] = repr(r)
except Exception as e: out["bad_deser"] = "raised " + repr(e)
# read back config settings
cfgS = eng.create_runtime_config()
cfgS.cuda_graph_strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
cfgS.dynamic_shapes_kernel_specialization_strategy = trt.DynamicShapesKernelSpecializationStrategy.EAGER
out["readback"] = [str(cfgS.cuda_graph_strategy), str(cfgS.dynamic_shapes_kernel_specialization_strategy), repr(cfgS.get_runtime_cache())]

# 3. whole graph capture on own stream vs legacy stream
def wgc(cfg): cfg.cuda_graph_strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
_, _, _, tg = run_with(cfg_mod=wgc, iters=5)
out["wgc_own_stream"] = tg
cfgL = eng.create_runtime_config(); wgc(cfgL); ctxL = eng.create_execution_context(cfgL)
x = dev.allocate(8 * 512, stream=stream); y = dev.allocate(8 * 512, stream=stream)
ctxL.set_input_shape("x", (8, 256)); ctxL.set_tensor_address("x", int(x.handle)); ctxL.set_tensor_address("y", int(y.handle))
out["wgc_legacy"] = [bool(ctxL.execute_async_v3(0)) for _ in range(3)]
cudart.cudaDeviceSynchronize()

# 4. latency: raw loop with prebound addresses, static batch 8 engine
plan8 = build_mlp(dyn=False); e8 = rt.deserialize_cuda_engine(plan8)
for strat in ("eager", "wgc"):
    cfg = e8.create_runtime_config()
    if strat == "wgc": wgc(cfg)
    c = e8.create_execution_context(cfg)
    xx = dev.allocate(8 * 512, stream=stream); yy = dev.allocate(8 * 512, stream=stream)
    c.set_tensor_address("x", int(xx.handle)); c.set_tensor_address("y", int(yy.handle))
    for _ in range(50): c.execute_async_v3(sh)
    stream.sync(); N = 2000; t = time.perf_counter()
    for _ in range(N): c.execute_async_v3(sh)
    stream.sync(); out[f"raw_{strat}_us"] = (time.perf_counter() - t) / N * 1e6

# 5. nonzero / output allocator (TensorRT-RTX 1.6.1: the builder has no NonZero runner)
nzplan = build_nonzero()
out["nonzero_builds"] = nzplan is not None
print(json.dumps(out, indent=1, default=str))
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe.json"), "w"), indent=1, default=str)
