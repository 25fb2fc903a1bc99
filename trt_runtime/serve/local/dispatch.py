"""Handing the clients' connections to the fronts in turn.

Fronts that accept from one shared listening socket share the clients unevenly: an event loop
that wakes takes every connection waiting, so the first front awake can take several (on a
2-core machine, 64 keep-alive connections over 16 fronts gave the busiest front 15 to 23 and up to
five fronts none; ``benchmarks/probes/cpu_front_balance.py``). A client keeps its connection, so
the skew stays for the connection's life. Here the supervisor accepts instead, on a thread of
its own, and passes each connection to the next front that is up, in turn, as a file descriptor
over a unix socket (``SCM_RIGHTS``): 64 connections over 16 fronts are 4 each. A front that is
down (dead, or not up yet) is skipped; with none up, a connection waits here until one is.

Linux only (:func:`supported`); elsewhere, or with ``TRT_RUNTIME_SERVE_DISPATCH=off``, the fronts
accept from the shared socket.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Callable

from trt_runtime.errors import SettingsError

__all__ = ["DISPATCH_ENV", "Dispatcher", "supported"]

#: Environment variable: ``on`` (the default where :func:`supported`) or ``off`` (the fronts
#: accept from the shared listening socket themselves).
DISPATCH_ENV = "TRT_RUNTIME_SERVE_DISPATCH"

#: How often the accepting thread looks whether it was asked to stop (seconds).
_POLL_S = 0.2
#: How long a hand-over may wait for a front that does not read its channel before the next
#: front gets the connection (seconds); the front stays in the turn.
_SEND_S = 1.0


def supported() -> bool:
    """Whether connections are handed over here: on Linux (``send_fds`` over ``SOCK_SEQPACKET``)
    unless :data:`DISPATCH_ENV` says ``off``; ``SettingsError`` for another value of it."""
    given = os.environ.get(DISPATCH_ENV, "")
    choice = given.strip().lower()
    if choice not in ("", "on", "off"):
        raise SettingsError(f"{DISPATCH_ENV} must be 'on' or 'off'; got {given!r}")
    linux = sys.platform.startswith("linux")
    return choice != "off" and linux and hasattr(socket, "send_fds") and hasattr(socket, "SOCK_SEQPACKET")


def channel() -> tuple[socket.socket, socket.socket]:
    """``(ours, the front's)``: a unix socket pair a front's connections are handed over on."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.set_inheritable(True)
    return ours, theirs


class Dispatcher:
    """Accepts on ``listener`` and hands each connection to the next front that is up, in turn.

    :meth:`up` adds a front's end of its channel (its index; a new one replaces an old),
    :meth:`down` removes it. :meth:`start` starts the accepting thread, :meth:`stop` ends it
    (idempotent; the listener stays open, its owner closes it). ``log`` hears of a front whose
    channel failed (it is taken down and the connection goes to the next).
    """

    def __init__(self, listener: socket.socket, log: Callable[[str], None] = lambda _message: None) -> None:
        self._listener = listener
        self._log = log
        self._channels: dict[int, socket.socket] = {}
        self._cond = threading.Condition()
        self._next = 0
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def up(self, index: int, ours: socket.socket) -> None:
        ours.settimeout(_SEND_S)
        with self._cond:
            old = self._channels.pop(index, None)
            self._channels[index] = ours
            self._cond.notify_all()
        if old is not None:
            old.close()

    def down(self, index: int) -> None:
        with self._cond:
            old = self._channels.pop(index, None)
        if old is not None:
            old.close()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trt-serve-dispatch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop accepting; the fronts keep the connections they have. Idempotent."""
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cond:
            channels, self._channels = list(self._channels.values()), {}
        for ours in channels:
            ours.close()

    # -- the accepting thread ----------------------------------------------------------------
    def _run(self) -> None:
        self._listener.settimeout(_POLL_S)
        while not self._stopped.is_set():
            try:
                conn, _address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._listener.fileno() == -1:  # the listener was closed under us
                    return
                # out of file descriptors, a connection reset before it was taken, ...: the
                # server keeps accepting (after a pause, so a lasting shortage does not spin)
                self._log(f"accepting a connection failed ({exc.strerror or exc}); accepting on")
                self._stopped.wait(_POLL_S / 4)
                continue
            with conn:  # (our copy: the front has its own once handed over)
                self._hand_over(conn)

    def _hand_over(self, conn: socket.socket) -> None:
        """Send ``conn`` to the next front that is up; wait for one while none is (or until stopped)."""
        while not self._stopped.is_set():
            with self._cond:
                if not self._channels:
                    self._cond.wait(_POLL_S)
                    continue
                indices = sorted(self._channels)
                index = next((i for i in indices if i >= self._next), indices[0])
                self._next = index + 1
                ours = self._channels[index]
            try:
                socket.send_fds(ours, [b"c"], [conn.fileno()])
                return
            except TimeoutError:  # a front that does not read (busy, or hung): the next one gets it
                self._log(f"front {index} did not take a connection within {_SEND_S:g} s; handing it on")
                continue
            except OSError as exc:  # the front went away: the next one gets it
                self._log(f"front {index} did not take a connection ({exc.strerror or exc}); handing it on")
                with self._cond:
                    if self._channels.get(index) is ours:
                        del self._channels[index]
                with contextlib.suppress(OSError):
                    ours.close()
