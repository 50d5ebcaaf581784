"""What an operator watches on `s5 serve`: `GET /metrics` in Prometheus' text format (`prometheus-client`), one
registry per server (nothing process-global, so two servers in one process count apart).

- `s5_live_streams`: utterances being synthesised now (the worker's streams, or requests without one);
- `s5_sessions_opened_total`, `s5_sessions_refused_total` (503: every slot busy), by kind (speech, conversation);
- `s5_first_audible_seconds`: request (or user line) to the first audible sample, a histogram;
- `s5_underruns_total`: times a player ran dry; `s5_real_time_factor`: synthesis time over audio time;
- `s5_llm_errors_total`: conversation turns whose LLM failed.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0)
RTF_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, live_streams):
        """`live_streams`: () -> the number of utterances being synthesised now."""
        self.registry = CollectorRegistry()
        self.live_streams = Gauge("s5_live_streams", "Utterances being synthesised now", registry=self.registry)
        self.live_streams.set_function(live_streams)
        self.opened = Counter("s5_sessions_opened", "Sessions opened", ["kind"], registry=self.registry)
        self.refused = Counter("s5_sessions_refused", "Sessions refused (every slot busy)", ["kind"],
                               registry=self.registry)
        self.first_audible = Histogram("s5_first_audible_seconds", "Request to the first audible sample",
                                       ["kind"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.underruns = Counter("s5_underruns", "Times a player ran dry", registry=self.registry)
        self.rtf = Histogram("s5_real_time_factor", "Synthesis time over audio time", buckets=RTF_BUCKETS,
                             registry=self.registry)
        self.llm_errors = Counter("s5_llm_errors", "Conversation turns whose LLM failed", registry=self.registry)

    def speech(self, result) -> None:
        """A finished `POST /v1/audio/speech` (a `SpeechResult`)."""
        if result.first_audible_ms is not None:
            self.first_audible.labels("speech").observe(result.first_audible_ms / 1000)
        self.underruns.inc(result.playback.underruns)
        if result.rtf is not None:
            self.rtf.observe(result.rtf)

    def turn(self, record) -> None:
        """A finished conversation turn (a `TurnRecord`)."""
        if record.e2e_ms is not None:
            self.first_audible.labels("conversation").observe(record.e2e_ms / 1000)
        self.underruns.inc(record.underruns)
        if record.rtf is not None:
            self.rtf.observe(record.rtf)
        if record.error and not record.error.startswith("this turn failed"):
            self.llm_errors.inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
