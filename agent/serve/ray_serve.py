"""`s5 serve --ray [ADDRESS]`: the server as a Ray Serve application, for more sessions than one process holds.

Each replica (`VoiceReplica`, one Ray actor) loads the voices once, runs its own batched worker and serves the
same routes as the standalone server through the ASGI adapter (`asgi.py`) over the same transport-free core
(`service.py`). Ray's proxy carries HTTP and WebSockets on `--port`; each WebSocket is one ongoing request for its
whole life, so a replica takes at most `max_sessions` of them (`max_ongoing_requests`, the figure one replica holds
in real time on its cores: docs/results.md) and autoscaling aims below it. An idle conversation is closed after
`--idle-timeout`, so it does not hold a slot forever.

Draining (scale-down, redeploy): a replica that Ray stops takes no new sessions; each conversation finishes the
reply it is speaking (at once when idle) and is closed with 1012, and its client reconnects, reaching another
replica, and sends `resume` with the history it kept (`session.py`). Ray cuts a replica after
`graceful_shutdown_timeout_s`, set from the longest reply a replica may be speaking (`longest_reply_s`).

Metrics go through Ray's metric API (`RayMetrics`), which Ray exports in Prometheus format for every replica on
each node's metrics port (`ray start --metrics-export-port`); docs/serving.md has the scrape set-up.

Threads: each replica's event loop owns its service; the driver (`serve_on_ray`) only deploys and waits.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import threading
from dataclasses import dataclass

from agent.serve.loading import ServerOptions, load_server
from agent.serve.metrics import METRICS, Metrics
from audio_io.errors import UserError

APP_NAME = "s5"
SECONDS_PER_WORD = 0.29  # the shipped voice's pace (docs/results.md, long replies: 0.280-0.289 s of audio a word)
CHARS_PER_WORD = 5.0  # English text with its spaces, a little under the average so the bound errs long
DRAIN_MARGIN_S = 10.0  # beyond the longest reply: the LLM's first token and the last audio's way to the client


def longest_reply_s(max_input_chars: int) -> float:
    """The longest a replica may be speaking one reply: a speech request of `max_input_chars` (a conversation's
    LLM reply is shorter: the embedded model writes at most 64 tokens)."""
    return max_input_chars / CHARS_PER_WORD * SECONDS_PER_WORD


@dataclass
class RayOptions:
    address: str  # "local" (start one here), "auto" (the running cluster) or a cluster's address
    replicas: int = 1
    autoscale: tuple[int, int] | None = None  # (min, max) replicas
    host: str = "127.0.0.1"
    port: int = 8080

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RayOptions":
        autoscale = None
        if args.autoscale:
            try:
                low, high = (int(n) for n in args.autoscale.split(":"))
            except ValueError:
                raise UserError(f"--autoscale {args.autoscale}: write MIN:MAX, e.g. 1:4") from None
            if not 0 <= low <= high or high < 1:
                raise UserError(f"--autoscale {args.autoscale}: need 0 <= MIN <= MAX and MAX >= 1")
            autoscale = (low, high)
        if args.replicas < 1:
            raise UserError("--replicas: at least 1")
        return cls(args.ray, args.replicas, autoscale, args.host, args.port)


def deployment_options(options: ServerOptions, ray: RayOptions, max_input_chars: int = 4096) -> dict:
    """Ray Serve's deployment options, from what limits a replica: its live conversations, not its request rate."""
    scaling = ({"autoscaling_config": {"min_replicas": ray.autoscale[0], "max_replicas": ray.autoscale[1],
                                       # aim below the limit, so a replica is added before sessions queue
                                       "target_ongoing_requests": max(1.0, 0.75 * options.max_sessions),
                                       "upscale_delay_s": 10.0, "downscale_delay_s": 120.0}}
               if ray.autoscale else {"num_replicas": ray.replicas})
    return {"max_ongoing_requests": options.max_sessions,
            "max_queued_requests": options.max_sessions,  # past that, Ray's proxy answers 503 at once
            "graceful_shutdown_timeout_s": longest_reply_s(max_input_chars) + DRAIN_MARGIN_S,
            "ray_actor_options": {"num_cpus": options.threads if options.batch_decode else 1},
            "health_check_period_s": 5.0, **scaling}


class RayMetrics(Metrics):
    """The same metrics through Ray's metric API (each replica's figures tagged with it by Ray)."""

    def __init__(self):
        from ray.util import metrics

        self.metrics = {}
        for name, metric in METRICS.items():
            if metric.kind == "counter":
                self.metrics[name] = metrics.Counter(name, metric.help, tag_keys=metric.labels)
            elif metric.kind == "gauge":
                self.metrics[name] = metrics.Gauge(name, metric.help, tag_keys=metric.labels)
            else:
                self.metrics[name] = metrics.Histogram(name, metric.help, boundaries=list(metric.buckets),
                                                       tag_keys=metric.labels)

    def _inc(self, name: str, amount: float = 1, **labels: str) -> None:
        self.metrics[name].inc(amount, tags=labels or None)

    def _observe(self, name: str, value: float, **labels: str) -> None:
        self.metrics[name].observe(value, tags=labels or None)

    def _set(self, name: str, value: float) -> None:
        self.metrics[name].set(value)


def replica_draining() -> bool:
    """Whether Ray has begun stopping this replica. Ray Serve has no public hook before it drains (`__del__`
    runs after), so this reads the replica actor's own flag; on a Ray without it, False (conversations are then
    cut at `graceful_shutdown_timeout_s` and their clients resume, as when a replica dies)."""
    try:
        import ray
        from ray._private.worker import global_worker

        actor_id = ray.get_runtime_context().get_actor_id()
        for key, actor in global_worker.actors.items():
            if str(getattr(key, "hex", lambda: key)()) == actor_id:
                return bool(getattr(getattr(actor, "_replica_impl", None), "_shutting_down", False))
    except Exception:  # noqa: BLE001 - a private attribute: absent means "not known to be draining"
        pass
    return False


class VoiceReplica:
    """One replica: the models loaded once, one service, one ASGI app (built by Ray through
    `__serve_build_asgi_app__`)."""

    def __init__(self, settings, options: ServerOptions):
        from ray import serve

        from agent.serve.service import VoiceService

        bundles, config, llm_factory = load_server(settings, options)
        self.service = VoiceService(bundles, config, llm_factory, RayMetrics(),
                                    replica=serve.get_replica_context().replica_tag)
        self.watching: asyncio.Task | None = None

    def __serve_build_asgi_app__(self):
        from agent.serve.asgi import create_asgi_app

        self.watching = asyncio.get_running_loop().create_task(self._watch())
        return create_asgi_app(self.service)

    async def _watch(self) -> None:
        """Every half second: drain once Ray stops this replica; the live-streams gauge."""
        while True:
            if replica_draining() and not self.service.draining:
                self.service.drain()
            self.service.metrics.live_streams(self.service.live_streams)
            await asyncio.sleep(0.5)

    def __del__(self):
        if self.watching is not None:
            self.watching.cancel()
        self.service.close()


def application(settings, options: ServerOptions, ray: RayOptions):
    """The Ray Serve application: one deployment of `VoiceReplica`."""
    from ray import serve

    replica = serve.ingress()(VoiceReplica)
    deployment = serve.deployment(name="voice", **deployment_options(options, ray))(replica)
    return deployment.bind(settings, options)


def serve_on_ray(settings, options: ServerOptions, ray_options: RayOptions) -> int:
    """Deploy on the cluster (or a local one), then wait; Ctrl-C removes the application (and stops a local
    cluster)."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise UserError("--ray needs Ray Serve: pip install 's5-agent[cluster]'") from None
    from tts.cli import err

    local = ray_options.address == "local"
    try:
        ray.init(address=None if local else ray_options.address, include_dashboard=False if local else None,
                 logging_level="WARNING", log_to_driver=False)
    except (ConnectionError, ValueError) as error:
        raise UserError(f"cannot reach the Ray cluster at {ray_options.address}: {error}") from None
    serve.start(http_options={"host": ray_options.host, "port": ray_options.port})
    serve.run(application(settings, options, ray_options), name=APP_NAME, route_prefix="/")
    scale = (f"{ray_options.autoscale[0]}-{ray_options.autoscale[1]} replicas" if ray_options.autoscale
             else f"{ray_options.replicas} replica{'s' * (ray_options.replicas > 1)}")
    err.print(f"[green]s5 serve on Ray ({scale}): http://{ray_options.host}:{ray_options.port}/health, "
              "POST /v1/audio/speech[/]")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # after Ray's own handlers, which would keep the driver alive
        signal.signal(signum, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    finally:
        serve.delete(APP_NAME)
        if local:
            serve.shutdown()
            ray.shutdown()
    return 0
