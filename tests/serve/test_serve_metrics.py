"""``ServeMetrics``: the request layer's Prometheus metrics, in one process and summed over several."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import trt_runtime
from trt_runtime.serve.metrics import ServeMetrics, mark_process_dead


def test_metrics_one_process() -> None:
    metrics = ServeMetrics("m")
    metrics.answered(200)
    metrics.answered(400)
    metrics.engine_call(3, 0.001)
    metrics.started()
    body, media = metrics.render()
    text = body.decode()
    assert media.startswith("text/plain")
    assert 'trt_runtime_requests_total{code="400",model="m"} 1.0' in text
    assert 'trt_runtime_batch_size_sum{model="m"} 3.0' in text
    assert 'trt_runtime_inflight_requests{model="m"} 1.0' in text
    assert "trt_runtime_requests_total" in ServeMetrics("m").render()[0].decode()  # no clash


def test_metrics_queued_many_counts_as_one_observation_each() -> None:
    """A batch's queue times go in as a few counter updates, with the exposition of one ``queued``
    per request: the same buckets (edges included), count and sum."""
    seconds = [0.0, 25e-6, 30e-6, 0.0004, 0.0004, 0.003, 2.0, 1e-7]
    one, many = ServeMetrics("m"), ServeMetrics("m")
    for s in seconds:
        one.queued(s)
    many.queued_many(seconds)

    def queue_lines(metrics: ServeMetrics) -> list[str]:
        text = metrics.render()[0].decode()
        return [line for line in text.splitlines() if line.startswith("trt_runtime_queue_seconds")
                and "_created" not in line]

    assert queue_lines(many) == queue_lines(one)
    assert 'trt_runtime_queue_seconds_bucket{le="2.5e-05",model="m"} 3.0' in queue_lines(many)
    assert 'trt_runtime_queue_seconds_count{model="m"} 8.0' in queue_lines(many)


_CHILD = """
import sys
from trt_runtime.serve.metrics import ServeMetrics
metrics = ServeMetrics("m")
for _ in range(int(sys.argv[1])):
    metrics.answered(200)
metrics.engine_call(4, 0.002)
metrics.queued_many([1e-5, 0.0003, 0.0003])
metrics.started()
if sys.argv[2] == "render":
    sys.stdout.write(metrics.render()[0].decode())
"""


@pytest.mark.parametrize("mark_dead", [False, True])
def test_metrics_sum_over_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mark_dead: bool) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    first = subprocess.Popen([sys.executable, "-c", _CHILD, "3", "quiet"], env=env)
    assert first.wait(60) == 0
    if mark_dead:
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        mark_process_dead(first.pid)
    text = subprocess.run(
        [sys.executable, "-c", _CHILD, "2", "render"], env=env, check=True, capture_output=True, text=True
    ).stdout
    assert 'trt_runtime_requests_total{code="200",model="m"} 5.0' in text
    assert 'trt_runtime_batch_size_count{model="m"} 2.0' in text
    assert 'trt_runtime_queue_seconds_bucket{le="0.0005",model="m"} 6.0' in text  # a batch's, per process
    assert 'trt_runtime_queue_seconds_count{model="m"} 6.0' in text
    # livesum: a process that exited counts until it is marked dead
    assert f'trt_runtime_inflight_requests{{model="m"}} {1.0 if mark_dead else 2.0}' in text


def test_metrics_refuse_a_directory_set_too_late(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import prometheus_client  # noqa: F401  (imported before the variable is set)

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    late = "PROMETHEUS_MULTIPROC_DIR was set after prometheus_client"
    with pytest.raises(trt_runtime.SettingsError, match=late):
        ServeMetrics("m")
