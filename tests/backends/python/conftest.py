"""The python backend's tests without a GPU: a ``torch`` fixture installing the FakeTorch of
tests/_python_doubles.py as ``sys.modules['torch']`` for the test that asks for it."""

from __future__ import annotations

import pytest
from _python_doubles import FakeTorch, fake_torch_fixture


@pytest.fixture
def torch(monkeypatch: pytest.MonkeyPatch) -> FakeTorch:
    return fake_torch_fixture(monkeypatch)
