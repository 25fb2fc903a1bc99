"""A torch user's call, typed: torch in, ``torch.Tensor`` out (tests/docs/test_user_types.py; needs torch)."""

from __future__ import annotations

import torch

import trt_runtime as trt


def run(path: str) -> torch.Tensor:
    with trt.load(path) as engine:
        y: torch.Tensor = engine(torch.ones(2, 4, device="cuda"))
        text: str = engine(torch.ones(2, 4, device="cuda"))  # error
        assert text
        return y.float()
