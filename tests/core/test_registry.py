"""Backend discovery through the ``trt_runtime.backends`` entry points."""

from __future__ import annotations

import subprocess
import sys
import types
from importlib.metadata import EntryPoint

import pytest

from trt_runtime import (
    Availability,
    BackendCapabilities,
    BackendNotFoundError,
    BackendUnavailableError,
    registry,
)
from trt_runtime.testing.memory import MemoryBackend


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    registry._reset()
    yield
    registry._reset()


class FakeBackend:
    """A backend that is installed but may lack its dependency."""

    capabilities = BackendCapabilities()

    def __init__(self, name: str, ok: bool, reason: str = "") -> None:
        self.name = name
        self._availability = Availability(ok, reason)

    def is_available(self) -> Availability:
        return self._availability


def _fake_entry_point(monkeypatch, name: str, factory) -> None:
    module = types.ModuleType("trt_fake_backend_plugin")
    module.Factory = factory
    monkeypatch.setitem(sys.modules, "trt_fake_backend_plugin", module)
    registry._discover()
    ep = EntryPoint(name=name, value="trt_fake_backend_plugin:Factory", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setitem(registry._entry_points, name, ep)


def test_registry_discovers_in_repo_backends_through_entry_points():
    installed = registry.installed_backends()
    assert {"memory", "python", "torchbind"} <= set(installed)
    eps = registry._discover()
    for name in ("memory", "python", "torchbind"):
        assert eps[name].group == registry.ENTRY_POINT_GROUP
        assert eps[name].dist is not None and eps[name].dist.name == "trt-runtime"
    assert eps["memory"].value == "trt_runtime.testing.memory:MemoryBackend"


def test_registry_loads_memory_backend_from_its_entry_point():
    backend = registry.get_backend("memory")
    assert isinstance(backend, MemoryBackend)
    assert registry.get_backend("memory") is backend  # one instance per name


def test_registry_unknown_name_lists_installed():
    message = r"no trt-runtime backend named 'nope'; installed backends: .*'memory'"
    with pytest.raises(BackendNotFoundError, match=message):
        registry.get_backend("nope")


def test_registry_env_var_selects_backend(monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, "memory")
    assert isinstance(registry.get_backend(), MemoryBackend)
    monkeypatch.setenv(registry.ENV_VAR, "nope")
    with pytest.raises(BackendNotFoundError, match="'nope'"):
        registry.get_backend()


def test_registry_explicit_name_beats_env_var(monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, "nope")
    assert isinstance(registry.get_backend("memory"), MemoryBackend)


def test_registry_instance_passes_through():
    backend = MemoryBackend()
    assert registry.get_backend(backend) is backend


def test_registry_default_order_skips_unavailable():
    assert registry.DEFAULT_ORDER == ("python", "torchbind")
    registry.register_backend(FakeBackend("python", False, "the 'python' backend needs tensorrt-rtx"))
    registry.register_backend(FakeBackend("torchbind", True))
    assert registry.get_backend().name == "torchbind"


def test_registry_default_order_prefers_python():
    registry.register_backend(FakeBackend("python", True))
    registry.register_backend(FakeBackend("torchbind", True))
    assert registry.get_backend().name == "python"


def test_registry_never_picks_memory_by_default():
    registry.register_backend(FakeBackend("python", False, "no python here"))
    registry.register_backend(FakeBackend("torchbind", False, "no torchbind here"))
    assert "memory" in registry.available_backends()
    with pytest.raises(BackendUnavailableError, match="python: no python here; torchbind: no torchbind here"):
        registry.get_backend()


def test_registry_missing_dependency_names_extra(monkeypatch):
    reason = "the 'fake' backend needs fakepkg: pip install -c constraints.txt -e '.[fake]'"
    _fake_entry_point(monkeypatch, "fake", lambda: FakeBackend("fake", False, reason))
    assert "fake" in registry.installed_backends()
    assert "fake" not in registry.available_backends()
    assert registry.backend_status()["fake"].reason == reason
    with pytest.raises(BackendUnavailableError, match=r"pip install -c constraints.txt -e '\.\[fake\]'"):
        registry.get_backend("fake")


def test_registry_broken_plugin_does_not_hide_others(monkeypatch):
    def explode():
        raise ImportError("No module named 'fakepkg'")

    _fake_entry_point(monkeypatch, "broken", explode)
    status = registry.backend_status()
    assert not status["broken"]
    assert "failed to load: No module named 'fakepkg'" in status["broken"].reason
    assert status["memory"]


def test_registry_memory_backend_without_numpy_names_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "numpy", None)
    availability = MemoryBackend().is_available()
    assert not availability
    assert "pip install -c constraints.txt -e '.[test]'" in availability.reason
    registry.register_backend(MemoryBackend())
    with pytest.raises(BackendUnavailableError, match=r"'memory' backend needs numpy"):
        registry.get_backend("memory")


def test_registry_import_is_light():
    code = (
        "import sys, trt_runtime, trt_runtime.registry, trt_runtime.testing.memory\n"
        "trt_runtime.registry.installed_backends()\n"
        "heavy = [m for m in ('torch', 'tensorrt', 'tensorrt_rtx', 'numpy', 'hypothesis', 'pytest') "
        "if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"import trt_runtime pulled in {result.stdout.strip()}"


def test_registry_capability_flags_defined_once() -> None:
    from trt_runtime.protocols import BackendCapabilities

    flags = BackendCapabilities.flags()
    assert flags[0] == "supports_runtime_cache" and "notes" not in flags
    on = BackendCapabilities.all_on()
    assert all(getattr(on, f) for f in flags)
    off = BackendCapabilities.all_off("no GPU here")
    assert not any(getattr(off, f) for f in flags) and off.notes == dict.fromkeys(flags, "no GPU here")
    some = on.without("supports_host_io", note="why")
    assert not some.supports_host_io and some.supports_runtime_cache
    assert some.notes == {"supports_host_io": "why"}
    with pytest.raises(ValueError, match=r"unknown capability flag\(s\) \['supports_teleport'\]"):
        on.without("supports_teleport")
