"""The one line that installs an optional extra of trt-runtime.

No index carries a ``trt-runtime`` distribution: every install runs from a checkout, with
``constraints.txt`` pinning the versions the project is tested with. Every "install this"
hint a message gives comes from :func:`install_hint`, so none names a form that cannot
work. The extras themselves are ``pyproject.toml``'s ``[project.optional-dependencies]``;
this module reads their names from the installed distribution, not from a copy.
"""

from __future__ import annotations

import functools

from trt_runtime.errors import SettingsError

__all__ = ["extras", "install_hint"]


@functools.lru_cache(maxsize=1)
def extras() -> tuple[str, ...]:
    """The installed distribution's extras (``Provides-Extra``); empty when its metadata is
    not to be found (a copy of the package that was never installed)."""
    from importlib import metadata

    try:
        return tuple(metadata.metadata("trt-runtime").get_all("Provides-Extra") or ())
    except metadata.PackageNotFoundError:
        return ()


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` from a checkout: ``pip install -c constraints.txt -e '.[EXTRA]'``.

    Raises :class:`~trt_runtime.errors.SettingsError` (a ``ValueError``) for a name that is
    not one of :func:`extras` (not checked where the metadata is missing).
    """
    known = extras()
    if known and extra not in known:
        raise SettingsError(f"extra must be one of {', '.join(map(repr, known))}; got {extra!r}")
    return f"pip install -c constraints.txt -e '.[{extra}]'"
