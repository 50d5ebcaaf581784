"""A real two-node Ray cluster on loopback for the tests: a head and a worker started with `ray start`, one CPU
each, each node exporting its metrics on its own port; stopped with `ray stop` (which also ends every Ray process
the tests left)."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.ollama_standin import free_port

RAY = Path(sys.executable).parent / "ray"


@dataclass
class RayCluster:
    address: str  # host:port of the head
    metrics_ports: tuple[int, int]  # the head's and the worker's Prometheus export


def _ray(*args: str, timeout: float = 120) -> None:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([str(RAY), *args], capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"ray {args[0]} failed: {done.stderr[-2000:]}")


def start_cluster() -> RayCluster:
    # Ray 2.60 turns token authentication on for a cluster once a token exists in ~/.ray (a local `ray.init()`
    # writes one); this loopback cluster and the drivers the tests start use none
    os.environ["RAY_AUTH_MODE"] = "disabled"
    port, head_metrics, worker_metrics = free_port(), free_port(), free_port()
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    _ray("start", "--head", f"--port={port}", "--include-dashboard=false", f"--metrics-export-port={head_metrics}",
         *common)
    _ray("start", f"--address=127.0.0.1:{port}", f"--metrics-export-port={worker_metrics}", *common)
    return RayCluster(f"127.0.0.1:{port}", (head_metrics, worker_metrics))


def stop_cluster() -> None:
    _ray("stop", "--force", timeout=60)
