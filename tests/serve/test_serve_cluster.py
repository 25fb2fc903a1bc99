"""Two Ray nodes on this machine (Ray's own multi-node test cluster, loopback only):
replicas land on both nodes, and either node's proxy and handles serve."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from _serve_support import (
    HOST,
    PORT_CLUSTER_HEAD,
    PORT_CLUSTER_WORKER,
    keep_ray_on_loopback,
    load_npy,
    npy,
    post,
    reference,
    require_serve,
    single_engine,
    wait_for_port,
)

serve = require_serve()

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from trt_runtime.serve import ServeOptions, build_app  # noqa: E402

# One Ray at a time on this machine: under xdist these modules share one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
NODE = {"num_cpus": 1, "node_ip_address": HOST, "object_store_memory": 80 * 1024 * 1024}


@pytest.fixture(scope="module")
def two_nodes() -> Any:
    keep_ray_on_loopback()
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    worker = cluster.add_node(**NODE, env_vars={"RAY_SERVE_WORKER_PROXY_HTTP_PORT": str(PORT_CLUSTER_WORKER)})
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    serve.start(proxy_location="EveryNode", http_options={"host": HOST, "port": PORT_CLUSTER_HEAD})
    options = ServeOptions(backend="memory", max_batch=4, batch_wait_ms=5, runtime_cache=None)
    # One CPU per replica and per node: the two replicas must take one node each.
    handle = serve.run(build_app(single_engine(), options, replicas=2, cpus_per_replica=1, name="Spread"),
                       name="spread", route_prefix="/spread")
    yield cluster, worker, handle
    serve.shutdown()
    ray.shutdown()
    cluster.shutdown()


def test_serve_two_nodes_place_one_replica_on_each(two_nodes: Any) -> None:
    _cluster, _worker, handle = two_nodes
    node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(node_ids) == 2
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while seen != node_ids and time.monotonic() < deadline:
        seen.add(handle.stats.remote().result()["node_id"])
    assert seen == node_ids


@ray.remote(num_cpus=0)
def _through_handle(first: int) -> list[Any]:
    handle = serve.get_app_handle("spread")
    inputs = [np.full((1, 4), first + i, np.float32) for i in range(8)]
    responses = [handle.remote(x) for x in inputs]
    return [(x, r.result()) for x, r in zip(inputs, responses, strict=True)]


def test_serve_two_nodes_serve_through_handles_on_either_node(two_nodes: Any) -> None:
    for k, node in enumerate(n["NodeID"] for n in ray.nodes() if n["Alive"]):
        pinned = _through_handle.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
        for x, y in ray.get(pinned.remote(100 * k)):
            np.testing.assert_array_equal(y, reference(x))


def test_serve_two_nodes_serve_over_http_through_either_proxy(two_nodes: Any) -> None:
    for port in (PORT_CLUSTER_HEAD, PORT_CLUSTER_WORKER):
        wait_for_port(port, 60)
        deadline = time.monotonic() + 30
        while True:  # a proxy answers 404/503 until it has learnt the route
            x = np.full((2, 4), port, np.float32)
            status, body, _ = post(f"http://{HOST}:{port}/spread/", npy(x), "application/x-npy")
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status == 200, (port, body)
        np.testing.assert_array_equal(load_npy(body), reference(x))
