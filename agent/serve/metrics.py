"""What an operator watches on `s5 serve`, defined once (`METRICS`) and recorded by one class (`Metrics`) through a
backend: Prometheus' text format at the standalone server's `GET /metrics` (`PrometheusMetrics`, one registry per
server, nothing process-global, so two servers in one process count apart), or Ray's metric API on a Ray replica
(`agent/serve/ray_serve.py`), which Ray's own Prometheus export carries for every replica.

- `s5_live_streams`: utterances being synthesised now (the worker's streams, or requests without one);
- `s5_sessions_opened_total`, `s5_sessions_refused_total` (503: every slot busy), by kind (speech, conversation);
- `s5_first_audible_seconds`: request (or user line) to the first audible sample, a histogram, by kind;
- `s5_underruns_total`: times a player ran dry; `s5_real_time_factor`: synthesis time over audio time;
- `s5_llm_errors_total`: conversation turns whose LLM failed.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

LATENCY_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0)
RTF_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0)


@dataclass(frozen=True)
class Metric:
    kind: str  # "counter", "gauge", "histogram"
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


METRICS = {
    "s5_live_streams": Metric("gauge", "Utterances being synthesised now"),
    "s5_sessions_opened": Metric("counter", "Sessions opened", ("kind",)),
    "s5_sessions_refused": Metric("counter", "Sessions refused (every slot busy)", ("kind",)),
    "s5_first_audible_seconds": Metric("histogram", "Request to the first audible sample", ("kind",), LATENCY_BUCKETS),
    "s5_underruns": Metric("counter", "Times a player ran dry"),
    "s5_real_time_factor": Metric("histogram", "Synthesis time over audio time", (), RTF_BUCKETS),
    "s5_llm_errors": Metric("counter", "Conversation turns whose LLM failed"),
}


class Metrics:
    """What a server records; a backend implements `_inc`, `_observe` and `_set` for the metrics of `METRICS`."""

    def _inc(self, name: str, amount: float = 1, **labels: str) -> None:
        raise NotImplementedError

    def _observe(self, name: str, value: float, **labels: str) -> None:
        raise NotImplementedError

    def _set(self, name: str, value: float) -> None:
        raise NotImplementedError

    def opened(self, kind: str) -> None:
        self._inc("s5_sessions_opened", kind=kind)

    def refused(self, kind: str) -> None:
        self._inc("s5_sessions_refused", kind=kind)

    def live_streams(self, n: int) -> None:
        self._set("s5_live_streams", n)

    def speech(self, result) -> None:
        """A finished `POST /v1/audio/speech` (a `SpeechResult`)."""
        if result.first_audible_ms is not None:
            self._observe("s5_first_audible_seconds", result.first_audible_ms / 1000, kind="speech")
        if result.playback.underruns:
            self._inc("s5_underruns", result.playback.underruns)
        if result.rtf is not None:
            self._observe("s5_real_time_factor", result.rtf)

    def turn(self, record) -> None:
        """A finished conversation turn (a `TurnRecord`)."""
        if record.e2e_ms is not None:
            self._observe("s5_first_audible_seconds", record.e2e_ms / 1000, kind="conversation")
        if record.underruns:
            self._inc("s5_underruns", record.underruns)
        if record.rtf is not None:
            self._observe("s5_real_time_factor", record.rtf)
        if record.error and not record.error.startswith("this turn failed"):
            self._inc("s5_llm_errors")


class PrometheusMetrics(Metrics):
    """The standalone server's: `text()` is the body of `GET /metrics`; `live_streams` is read at each scrape."""

    def __init__(self, live_streams: Callable[[], int]):
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram

        self.content_type = CONTENT_TYPE_LATEST
        self.registry = CollectorRegistry()
        self.metrics = {}
        for name, metric in METRICS.items():
            if metric.kind == "counter":
                self.metrics[name] = Counter(name, metric.help, metric.labels, registry=self.registry)
            elif metric.kind == "gauge":
                self.metrics[name] = Gauge(name, metric.help, metric.labels, registry=self.registry)
            else:
                self.metrics[name] = Histogram(name, metric.help, metric.labels, buckets=metric.buckets,
                                               registry=self.registry)
        self.metrics["s5_live_streams"].set_function(live_streams)

    def _labelled(self, name: str, labels: dict):
        return self.metrics[name].labels(**labels) if labels else self.metrics[name]

    def _inc(self, name: str, amount: float = 1, **labels: str) -> None:
        self._labelled(name, labels).inc(amount)

    def _observe(self, name: str, value: float, **labels: str) -> None:
        self._labelled(name, labels).observe(value)

    def _set(self, name: str, value: float) -> None:  # read at each scrape instead
        pass

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
