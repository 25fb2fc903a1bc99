"""Hostile ``.pte`` programs for the tests: vectors whose entries alias one table."""

from __future__ import annotations

import dataclasses
import struct

from trt_runtime.formats.flatbuffer import Bytes, Obj, String, Table, Vector, Writer
from trt_runtime.formats.tr01 import pack_tr01
from trt_runtime.protocols import TensorSpec


@dataclasses.dataclass
class Alias(Obj):
    """A vector of ``count`` offsets that all point at one copy of ``item``."""

    item: Obj
    count: int


class AliasWriter(Writer):
    """The flatbuffer writer, plus :class:`Alias` vectors (which it never writes itself)."""

    def place(self, obj: Obj) -> int:
        if not isinstance(obj, Alias):
            return super().place(obj)
        self.pad(4, 4)
        pos = len(self.buf)
        self.buf += struct.pack("<I", obj.count)
        slots = len(self.buf)
        self.buf += b"\x00" * (4 * obj.count)
        target = self.place(obj.item)
        for i in range(obj.count):
            struct.pack_into("<I", self.buf, slots + 4 * i, target - (slots + 4 * i))
        return pos


def blob(bindings: int, *, engine: bytes = b"\x00" * 64) -> bytes:
    """A valid TR01 blob with ``bindings`` float32 bindings."""
    specs = [
        TensorSpec(name=f"b{i}", dtype="float32", shape=(1,), is_input=i % 2 == 0) for i in range(bindings)
    ]
    return pack_tr01(engine, specs)


def aliased_program(
    *, bindings: int, delegates: int, instructions: int, args: int = 0, target_device: bytes | None = None
) -> bytes:
    """An inline ``.pte`` whose delegates, instructions and call arguments alias one table each."""
    specs = None
    if target_device is not None:
        spec = Table([("off", String("target_device")), ("off", Bytes(memoryview(target_device), 4))])
        specs = ("off", Vector("off", [spec]))
    delegate = Table([("off", String("TensorRTBackend")), ("off", Table([("<B", 0), ("<I", 0)])), specs])
    call = Table([("<i", 0), ("off", Vector("<i", [0] * args))])
    instruction = Table([("<B", 2), ("off", call)])
    tensor = Table([("<b", 6), None, ("off", Vector("<i", [1]))])
    chain = Table([None, None, ("off", Alias(instruction, instructions))])
    plan = Table(
        [
            ("off", String("forward")),
            None,
            ("off", Alias(Table([("<B", 5), ("off", tensor)]), 1)),
            None,
            None,
            ("off", Vector("off", [chain])),
            None,
            ("off", Alias(delegate, delegates)),
        ]
    )
    inline = Vector("off", [Table([("off", Bytes(memoryview(blob(bindings))))])])
    root = Table([("<I", 0), ("off", Vector("off", [plan])), None, ("off", inline), None, None, None, None])
    writer = AliasWriter(b"\x00" * 4 + b"ET12")
    struct.pack_into("<I", writer.buf, 0, writer.place(root))
    return bytes(writer.buf)
