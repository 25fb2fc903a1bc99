"""``python _two_engines.py ENGINE PORT``: the local server with two engine processes on a CPU.

The command line gives one engine process per GPU, so without a GPU only one; the
supervisor itself takes any number (``LocalServerConfig.gpus``). Prints the same JSON
document as ``trt-runtime --json serve`` once every process is up; SIGINT stops it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from trt_runtime.serve.local import LocalServer, LocalServerConfig, bind_socket
from trt_runtime.serve.options import ServeOptions


def main(engine: str, port: int) -> int:
    options = ServeOptions(backend="memory", max_batch=16, runtime_cache=None)
    config = LocalServerConfig(Path(engine), options, "affine", port=port, workers=2, gpus=(None, None),
                               max_queue_delay_us=2000)
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    server = LocalServer(config, bind_socket("127.0.0.1", port), log=log)

    def ready(_model: Any) -> None:
        print(json.dumps({"url": f"http://127.0.0.1:{port}", "pids": server.pids()}), flush=True)

    return server.run(on_ready=ready)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
