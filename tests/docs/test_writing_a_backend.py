"""The complete backend of docs/writing-a-backend.md, as written there, run through the
conformance kit: the page's skeleton is a backend, not a sketch."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trt_runtime import EngineSource, registry
from trt_runtime.testing import array_kinds
from trt_runtime.testing.conformance import BackendConformance

PAGE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md"


def _skeleton() -> dict[str, Any]:
    """The namespace of the page's first Python block (under "A complete backend")."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("## A complete backend"):]
    code = re.search(r"```python\n(.*?)\n```", section, re.S)
    assert code is not None, "the page shows its backend as a Python block"
    namespace: dict[str, Any] = {"__name__": "square_backend"}
    try:
        exec(compile(code.group(1), f"{PAGE.name} (A complete backend)", "exec"), namespace)
    finally:
        registry._extra.pop("square", None)  # registered by the block: not for other tests
    return namespace


SKELETON = _skeleton()


class TestSquareBackendConformance(BackendConformance):
    # numpy on the host: outputs are numpy arrays, host inputs are used where they are.
    preallocated_output_kinds = (array_kinds.NUMPY,)
    static_output_kinds = (array_kinds.NUMPY,)
    host_staging_logged = False

    @pytest.fixture
    def backend(self) -> Any:
        return SKELETON["SquareBackend"]()

    @pytest.fixture
    def engine_source(self) -> EngineSource:
        return EngineSource(b"SQUARE", name="square")

    @pytest.fixture
    def input_kinds(self) -> Any:
        # numpy is the skeleton's only array kind, by design.
        return {array_kinds.NUMPY: array_kinds.converter(array_kinds.NUMPY)}

    @pytest.fixture
    def make_inputs(self) -> Any:
        return lambda rng: [rng.standard_normal((int(rng.integers(1, 9)), 4)).astype(np.float32)]

    @pytest.fixture
    def reference(self) -> Any:
        return lambda inputs: [inputs[0] * inputs[0]]


def test_writing_a_backend_skeleton_lanes_are_its_lane_ops() -> None:
    engine = SKELETON["SquareBackend"]().load_engine(EngineSource(b"SQUARE", name="sq"))
    engine.contexts = 2
    assert [type(lane.ops).__name__ for lane in engine._lanes] == ["SquareLane", "SquareLane"]
    engine.close()
