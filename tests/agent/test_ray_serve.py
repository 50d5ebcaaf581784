"""`s5 serve --ray` on a real two-node Ray cluster (head and worker started with `ray start` on loopback): two
replicas behind Ray's proxy, each with the shipped voice; Ray's metric export carrying every replica's figures; a
scale-down that lets the reply being spoken end before the conversation is moved; then, scaled back to two, a
replica's process killed mid-reply (its user loses the rest of that reply, reconnects, resumes, and the next turn
has the whole conversation in context; the user on the other replica notices nothing). The tests run in this order
(a killed replica takes Ray minutes to restart, a new one seconds)."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.ollama_standin import free_port

pytest.importorskip("ray", reason="s5 serve --ray needs s5-agent[cluster]")



@pytest.fixture(scope="module")
def cluster():
    from tests.ray_cluster import start_cluster, stop_cluster

    try:
        yield start_cluster()
    finally:
        stop_cluster()


@pytest.fixture(scope="module")
def ollama():
    """The Ollama stand-in on a thread of its own; yields (its URL, the requests it received)."""
    from tests.ollama_standin import REQUESTS, start

    port, loop, ready = free_port(), asyncio.new_event_loop(), threading.Event()
    runner = {}

    def serve():
        asyncio.set_event_loop(loop)
        runner["r"] = loop.run_until_complete(start(port))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    yield f"http://127.0.0.1:{port}", runner["r"].app[REQUESTS]
    asyncio.run_coroutine_threadsafe(runner["r"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


def deploy(cluster, ollama_url: str, port: int, replicas: int) -> subprocess.Popen:
    """`s5 serve --ray` as a user runs it (a driver that deploys and waits)."""
    return subprocess.Popen([sys.executable, "-m", "agent.cli", "serve", "--ray", cluster.address, "--replicas",
                             str(replicas), "--port", str(port), "--threads", "1", "--max-sessions", "4",
                             "--llm", "ollama", "--ollama-host", ollama_url, "--ollama-model", "story"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "CI": "true"})


def health(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return json.load(response)
    except OSError:
        return None


@pytest.fixture(scope="module")
def served(cluster, ollama):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    driver = deploy(cluster, ollama[0], port, replicas=2)
    try:
        deadline, seen = time.monotonic() + 300, set()
        while len(seen) < 2:  # both replicas answering through the proxy
            assert time.monotonic() < deadline, "the replicas did not come up"
            if driver.poll() is not None:
                raise AssertionError(driver.stderr.read().decode()[-1500:])
            if (h := health(url)) is not None:
                seen.add(h["replica"])
            time.sleep(0.3)
        yield url, driver
    finally:
        driver.send_signal(signal.SIGINT)  # removes the application
        try:
            driver.wait(timeout=60)
        except subprocess.TimeoutExpired:
            driver.kill()


class Client:
    """A conversation as the page keeps it: the history of the last "history" event, resumed on reconnect."""

    def __init__(self, session, url: str):
        self.session, self.url, self.history, self.ws, self.replica = session, url, [], None, None

    async def connect(self, resume: bool = False) -> str:
        self.ws = await self.session.ws_connect(self.url.replace("http", "ws") + "/ws")
        ready = await self.ws.receive_json()
        self.replica = ready["replica"]
        if resume:
            await self.ws.send_json({"type": "resume", "history": self.history})
            assert (await self.ws.receive_json())["type"] == "history"
        return self.replica

    async def turn(self, text: str, on_audio=None) -> dict:
        """One turn; returns {"record": ... or None, "audio_bytes", "closed": close code or None}."""
        from aiohttp import WSMsgType

        await self.ws.send_json({"type": "user", "text": text})
        audio, record = 0, None
        while True:
            message = await self.ws.receive()
            if message.type == WSMsgType.BINARY:
                audio += len(message.data)
                if on_audio is not None:
                    await on_audio(audio)
            elif message.type == WSMsgType.TEXT:
                event = json.loads(message.data)
                if event["type"] == "record":
                    record = event["record"]
                elif event["type"] == "history":
                    self.history = event["history"]
                    if record is not None:
                        return {"record": record, "audio_bytes": audio, "closed": None}
            else:
                return {"record": record, "audio_bytes": audio, "closed": self.ws.close_code}


async def on_two_replicas(session, url: str, wait_s: float = 240) -> tuple[Client, Client]:
    """Two conversations on different replicas. Ray's proxy prefers the replica on its own node while that one has
    room, so new conversations are opened until one lands elsewhere (a replica still starting takes a while)."""
    deadline = time.monotonic() + wait_s
    first = Client(session, url)
    await first.connect()
    while time.monotonic() < deadline:
        second = Client(session, url)
        if await second.connect() != first.replica:
            return first, second
        await second.ws.close()
        await asyncio.sleep(0.2)
    raise AssertionError("every conversation landed on one replica")


def exported_opens(cluster) -> dict[str, float]:
    """Conversations opened, per replica process, as Ray's Prometheus export on each node shows them."""
    opened = {}
    for port in cluster.metrics_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("ray_s5_sessions_opened") and 'kind="conversation"' in line:
                    opened[line.split('WorkerId="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return opened


@pytest.mark.slow
def test_metrics_of_every_replica_then_a_scale_down_lets_the_reply_end_and_moves_the_conversation(
        served, cluster, ollama):
    """Both replicas' metrics reach Ray's own Prometheus export (one port per node; no /metrics route behind the
    proxy). Then a redeploy from 2 replicas to 1 while both speak: both replies are heard whole, and the stopped
    replica's conversation is closed with 1012 (its client would resume elsewhere); the other stays open."""
    import aiohttp

    url, _ = served
    port = int(url.rsplit(":", 1)[1])

    async def run():
        async with aiohttp.ClientSession() as session:
            pair = await on_two_replicas(session, url)
            for _ in range(60):  # Ray reports every few seconds
                if len(opened := exported_opens(cluster)) >= 2:
                    break
                await asyncio.sleep(1)
            shrink = {}

            async def scale_down(audio_bytes: int) -> None:
                if audio_bytes > 16000 and not shrink:
                    shrink["driver"] = deploy(cluster, ollama[0], port, replicas=1)

            turns = await asyncio.gather(pair[0].turn("Tell me a story.", on_audio=scale_down),
                                         pair[1].turn("Tell me a story."))
            # the stopped replica's conversation is closed once its reply has gone out; the other stays open
            receiving = {asyncio.ensure_future(client.ws.receive()): client for client in pair}
            done, pending = await asyncio.wait(receiving, timeout=120, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            closes = [receiving[task].ws.close_code for task in done]
            shrink["driver"].kill()  # it deployed and waits like any `s5 serve`; the application stays
            return opened, turns, closes

    opened, turns, closes = asyncio.run(run())
    assert len(opened) >= 2 and all(n >= 1 for n in opened.values())  # each replica's conversations counted
    assert all(t["record"] is not None and t["record"]["error"] is None for t in turns)  # both replies whole
    assert closes == [1012]


@pytest.mark.slow
def test_a_killed_replica_costs_its_user_the_rest_of_one_reply_and_no_one_else_anything(served, cluster, ollama):
    import aiohttp

    url, _ = served
    requests = ollama[1]
    grow = deploy(cluster, ollama[0], int(url.rsplit(":", 1)[1]), replicas=2)  # back to two after the scale-down
    while "s5 serve on Ray" not in (line := grow.stderr.readline().decode()):  # deployed: any rollout is over
        assert line or grow.poll() is None, "the redeploy failed"

    async def run():
        async with aiohttp.ClientSession() as session:
            ada, bob = await on_two_replicas(session, url)
            answering = health(url)  # the replica /health reaches, and its process: Ada is the one on it
            if bob.replica == answering["replica"]:
                ada, bob = bob, ada
            assert ada.replica == answering["replica"]
            victim = answering["pid"]
            first = await ada.turn("My name is Ada.")
            assert first["record"]["error"] is None

            async def kill_mid_reply(audio_bytes: int) -> None:
                if audio_bytes > 16000 and victim:  # half a second of Ada's second reply has reached her
                    os.kill(victim, signal.SIGKILL)

            cut, untouched = await asyncio.gather(ada.turn("Tell me a story.", on_audio=kill_mid_reply),
                                                  bob.turn("Hello there."))
            await ada.connect(resume=True)  # as the page does: reconnect, send the history it kept
            after = await ada.turn("What is my name?")
            return first, cut, untouched, after

    try:
        first, cut, untouched, after = asyncio.run(run())
    finally:
        grow.kill()
    assert cut["record"] is None and cut["closed"] is not None  # Ada lost the rest of that reply, and knew it
    assert untouched["closed"] is None and untouched["record"]["error"] is None  # Bob noticed nothing
    assert untouched["record"]["reply"].startswith("Once upon a time") and untouched["audio_bytes"] > 0
    assert after["record"]["error"] is None and after["audio_bytes"] > 0
    asked = [m["content"] for m in requests[-1]["messages"]]  # what the LLM read for Ada's next turn
    assert "My name is Ada." in asked and asked[-1] == "What is my name?"


def test_deployment_options_come_from_what_limits_a_replica():
    """No cluster needed: the options `s5 serve --ray` hands Ray Serve."""
    import argparse

    from agent.serve.loading import ServerOptions
    from agent.serve.ray_serve import RayOptions, deployment_options, longest_reply_s
    from audio_io.errors import UserError

    def ray_options(**flags):
        return RayOptions.from_args(argparse.Namespace(**{"ray": "auto", "replicas": 1, "autoscale": None,
                                                          "host": "127.0.0.1", "port": 8080, **flags}))

    options = ServerOptions(max_sessions=8, threads=2)
    fixed = deployment_options(options, ray_options(replicas=3))
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["max_ongoing_requests"] == 8 and fixed["ray_actor_options"] == {"num_cpus": 2}
    assert fixed["graceful_shutdown_timeout_s"] > longest_reply_s(4096) > 200  # a 4096-character reply ends first
    scaled = deployment_options(options, ray_options(autoscale="2:6"))["autoscaling_config"]
    assert (scaled["min_replicas"], scaled["max_replicas"]) == (2, 6) and scaled["target_ongoing_requests"] == 6
    for bad in ("6:2", "two:six", "3"):
        with pytest.raises(UserError, match="--autoscale"):
            ray_options(autoscale=bad)
