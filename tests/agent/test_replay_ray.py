"""`s5 replay SCRIPTS... --ray ADDRESS` on a real two-node Ray cluster: the scripts run as Ray tasks on both
nodes, every turn's record comes back into one latency.jsonl with one summary table, and a broken script is
reported by its name while the others finish."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="s5 replay --ray needs s5-agent[cluster]")
pytestmark = pytest.mark.slow


def test_scripts_play_as_ray_tasks_across_two_nodes_and_a_broken_one_is_named(tmp_path):
    from tests.ray_cluster import start_cluster, stop_cluster

    broken = tmp_path / "broken.yaml"
    broken.write_text("turns: [unclosed\n")
    scripts = ["examples/short_answers.yaml", "examples/interrupted.yaml", str(broken)]
    cluster = start_cluster()
    try:
        done = subprocess.run([sys.executable, "-m", "agent.cli", "replay", *scripts, "--ray", cluster.address,
                               "--scripts-per-task", "1", "--json", "--out", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=600, env={**os.environ, "CI": "true"})
    finally:
        stop_cluster()
    assert done.returncode == 1, done.stderr[-1500:]  # one script failed
    rows = {row["script"]: row for row in json.loads(done.stdout.strip().splitlines()[-1])["scripts"]}
    assert rows["short answers"]["turns"] == 3 and rows["interrupted"]["turns"] == 3
    assert rows["short answers"]["failed"] is None and rows["short answers"]["errors"] == 0
    assert "broken.yaml is not valid YAML" in rows["broken"]["failed"]
    assert rows["short answers"]["where"] != rows["interrupted"]["where"]  # one task on each node
    assert rows["all"]["turns"] == 6 and rows["all"]["e2e_p50_ms"] is not None
    lines = [json.loads(line) for line in (tmp_path / "out" / "latency.jsonl").read_text().splitlines()]
    assert sorted({line["script"] for line in lines}) == ["interrupted", "short answers"] and len(lines) == 6
    assert all("e2e_ms" in line for line in lines)
