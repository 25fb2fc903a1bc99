"""The one input-kind loop of the core (:func:`trt_runtime.contract.read_inputs`), which both
backends run: the call's kind follows the mixing rule of :func:`call_kind` for every mix of
input kinds, host inputs are listed by position, and a backend's ``read`` error stops the loop."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from typing import Any

import pytest

from trt_runtime.contract import (
    READ_DEVICE,
    READ_HOST,
    READ_TORCH_CUDA,
    READ_TORCH_HOST,
    ArrayKind,
    call_kind,
    read_inputs,
)
from trt_runtime.errors import InputError

#: What a ``read`` reports for each array kind of the device contract.
READ_OF = {
    ArrayKind.TORCH_CUDA: READ_TORCH_CUDA,
    ArrayKind.CUDA_ARRAY: READ_DEVICE,
    ArrayKind.NUMPY: READ_HOST,
    ArrayKind.TORCH_CPU: READ_TORCH_HOST,
}


def _read(spec: Any, x: tuple[ArrayKind, int]) -> tuple[int, Any, Any]:
    kind, n = x
    if n < 0:
        raise InputError(f"input {spec!r}: bad {n}")
    return READ_OF[kind], f"value-{spec}", (n,)


@pytest.mark.parametrize("kinds", [
    mix for size in (1, 2, 3) for mix in itertools.product(list(ArrayKind), repeat=size)
], ids=lambda mix: "+".join(map(str, mix)))
def test_contract_read_inputs_kind_follows_the_mixing_rule(kinds: tuple[ArrayKind, ...]) -> None:
    specs = [f"in{i}" for i in range(len(kinds))]
    inputs = [(kind, i + 1) for i, kind in enumerate(kinds)]
    kind, values, shapes, host, torch_host = read_inputs(specs, inputs, _read)
    assert kind is call_kind(kinds)
    assert values == [f"value-in{i}" for i in range(len(kinds))]
    assert shapes == tuple((i + 1,) for i in range(len(kinds)))
    on_host = [i for i, k in enumerate(kinds) if k.on_host]
    assert host == (on_host or None)
    assert torch_host is (ArrayKind.TORCH_CPU in kinds)


def test_contract_read_inputs_stops_at_the_first_bad_input() -> None:
    seen: list[Any] = []

    def read(spec: Any, x: tuple[ArrayKind, int]) -> tuple[int, Any, Any]:
        seen.append(spec)
        return _read(spec, x)

    inputs = [(ArrayKind.NUMPY, 1), (ArrayKind.TORCH_CUDA, -1), (ArrayKind.NUMPY, 1)]
    with pytest.raises(InputError, match=r"input 'b': bad -1"):
        read_inputs(["a", "b", "c"], inputs, read)
    assert seen == ["a", "b"]


def test_contract_read_inputs_is_the_loop_of_both_backends() -> None:
    """Neither backend's contract module keeps a loop of its own over input kinds."""
    import trt_runtime_backends.python.contract as python_contract
    import trt_runtime_backends.torchbind.contract as torchbind_contract

    for module in (python_contract, torchbind_contract):
        assert module.read_inputs is read_inputs
        tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        assert names.isdisjoint({"KIND_TORCH", "KIND_DEVICE", "KIND_HOST"}), module.__name__
