"""The in-repo backends of trt-runtime, installed as ``trt_runtime_backends``.

Each subpackage registers itself in the ``trt_runtime.backends`` entry-point group
and imports only the public ``trt_runtime`` API, never another backend.
"""
