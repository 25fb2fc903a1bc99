"""One engine served by one process: batcher, HTTP app and uvicorn on a thread of this process.

:class:`InProcessServer` is the whole request layer without the process split: the
engine's calls run on one thread per execution context, the
:class:`~trt_runtime.serve.batcher.DynamicBatcher` and the HTTP app share uvicorn's event
loop on a background thread. Tests and benchmarks use it; ``trt-runtime serve`` splits
the same pieces into front processes and one engine process per GPU.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from trt_runtime.errors import TrtRuntimeError
from trt_runtime.serve.model import ModelInfo
from trt_runtime.serve.options import DEFAULT_MAX_BODY_BYTES

__all__ = ["InProcessServer"]


class InProcessServer:
    """Serve ``engine`` (borrowed: the caller closes it) as ``model`` on ``host:port``.

    ``port=0`` takes a free port (see :attr:`url`). ``contexts``: engine threads, each
    calling ``engine.execute`` (more than one needs an engine with several execution
    contexts). :meth:`close` stops accepting, lets requests in flight finish (at most
    ``drain_s`` seconds) and joins the thread; idempotent. A context manager.
    """

    def __init__(
        self,
        engine: Any,
        model: ModelInfo,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        contexts: int = 1,
        max_queue_delay_us: int = 0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        copy_outputs: bool = False,
        drain_s: float = 10.0,
    ) -> None:
        from trt_runtime.serve.batcher import DynamicBatcher
        from trt_runtime.serve.http import make_app
        from trt_runtime.serve.metrics import ServeMetrics

        self.model = model
        self.metrics = ServeMetrics(model.name)
        self.batcher = DynamicBatcher(
            [engine.execute] * contexts, model.checker, max_batch=model.max_batch,
            max_queue_delay_us=max_queue_delay_us, metrics=self.metrics, copy_outputs=copy_outputs,
        )
        self._up = threading.Event()
        self._settled = threading.Event()  # started, or failed to
        self.app = make_app(
            model, self.batcher.submit, metrics=self.metrics, ready=self._up.is_set,
            max_body_bytes=max_body_bytes,
        )
        self._drain_s = drain_s
        self._socket = socket.create_server((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> InProcessServer:
        """Start serving; returns once uvicorn accepts requests."""
        import uvicorn

        if self._thread is not None:
            return self
        config = uvicorn.Config(
            self.app, lifespan="off", access_log=False, log_level="warning", loop="asyncio",
            timeout_graceful_shutdown=max(1, round(self._drain_s)),
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"trt-serve-{self.model.name}", daemon=True)
        self._thread.start()
        if not self._settled.wait(timeout_s) or not self._up.is_set():
            self.close()
            why = f": {self._failure!r}" if self._failure else ""
            raise TrtRuntimeError(
                f"the in-process server of {self.model.name!r} did not start in {timeout_s} s{why}"
            )
        return self

    def _run(self) -> None:
        async def main() -> None:
            server = self._server
            serving = asyncio.ensure_future(server.serve(sockets=[self._socket]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.005)
            if server.started:
                self._up.set()
            self._settled.set()
            await serving
            await self.batcher.aclose(self._drain_s)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by start()
            self._failure = exc
        finally:
            self._settled.set()

    def close(self) -> None:
        if self._thread is None:
            self._socket.close()
            return
        self._up.clear()
        self._server.should_exit = True
        self._thread.join(self._drain_s + 10)
        self._thread = None
        self._socket.close()

    def __enter__(self) -> InProcessServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
