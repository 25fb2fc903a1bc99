# Source on the GPU host after .gpu/pNN/install.sh: installs this checkout (and the
# small wheels in .whl/ the host lacks) into /tmp/trt-site and puts it on PYTHONPATH.
rm -rf /tmp/trt-site && mkdir -p /tmp/trt-site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/trt-site .whl/*.whl 2>&1 | grep -v WARNING
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/trt-site . 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/trt-site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
python3 -c "import trt_runtime, importlib.metadata as m; print('trt-runtime', trt_runtime.__version__, 'backends:', trt_runtime.backend_status())"
