"""Misuses the type checkers must reject (tests/docs/test_user_types.py counts one error per line
marked ``# error``)."""

from __future__ import annotations

import numpy as np

import trt_runtime as trt
from trt_runtime import RuntimeSettings


def misuse(path: str) -> None:
    RuntimeSettings(cuda_graph_strategy="fast")  # error
    with trt.load(path) as engine:
        with trt.runtime_config(engine, cuda_graph="oops"):  # error
            pass
        with trt.runtime_config(engine, cuda_graph_strategy="sometimes"):  # error
            pass
        name: str = engine.device  # error
        text: str = engine(np.ones((2, 4), np.float32))  # error
        assert name and text
