"""Which memory may a graph memcpy node's address be changed to? (cudaErrorInvalidValue seen
when the node was built on cuda.core memory and set to torch memory.) Prints one line per case."""
import torch
from cuda.bindings import runtime as rt

d2d = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
nb = 256
torch.cuda.init()
s = torch.cuda.Stream()
h = int(s.cuda_stream)


def pool(n):
    err, p = rt.cudaMallocAsync(n, h)
    assert not err, err
    rt.cudaStreamSynchronize(h)
    return int(p)


def plain_malloc(n):
    err, p = rt.cudaMalloc(n)
    assert not err, err
    return int(p)


def tmem(n):
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    keep.append(t)
    return t.data_ptr()


keep = []
kinds = {"pool": pool, "cudaMalloc": plain_malloc, "torch": tmem}
try:
    from cuda.core import Device
    dev = Device(0)
    dev.set_current()
    core_stream = dev.create_stream()

    def core(n):
        buf = dev.allocate(n, stream=core_stream)
        core_stream.sync()
        keep.append(buf)
        return int(buf.handle)

    kinds["cuda.core"] = core
except Exception as exc:
    print("no cuda.core:", exc)

for orig_name, orig in kinds.items():
    for new_name, new in kinds.items():
        static = orig(nb)
        err, g = rt.cudaGraphCreate(0)
        placeholder = orig(nb)
        err, node = rt.cudaGraphAddMemcpyNode1D(g, None, 0, static, placeholder, nb, d2d)
        if err:
            print(f"build {orig_name}: {err}")
            continue
        err, ex = rt.cudaGraphInstantiate(g, 0)
        src = new(nb)
        (err,) = rt.cudaGraphExecMemcpyNodeSetParams1D(ex, node, static, src, nb, d2d)
        (lerr,) = rt.cudaGraphLaunch(ex, h)
        rt.cudaStreamSynchronize(h)
        outcome = str(err).split(".")[-1]
        print(f"node built on {orig_name:10s} set to {new_name:10s}: {outcome:40s} "
              f"launch {str(lerr).split('.')[-1]}", flush=True)
# the same with the static side on cuda.core and the placeholder freed after instantiate
if "cuda.core" in kinds:
    static = kinds["cuda.core"](nb)
    t = torch.empty(nb, dtype=torch.uint8, device="cuda")
    err, g = rt.cudaGraphCreate(0)
    err, node = rt.cudaGraphAddMemcpyNode1D(g, None, 0, static, t.data_ptr(), nb, d2d)
    err, ex = rt.cudaGraphInstantiate(g, 0)
    del t
    torch.cuda.empty_cache()
    src = torch.empty(nb, dtype=torch.uint8, device="cuda")
    (err,) = rt.cudaGraphExecMemcpyNodeSetParams1D(ex, node, static, src.data_ptr(), nb, d2d)
    print("static cuda.core, torch placeholder freed (empty_cache), set to new torch:", err)
