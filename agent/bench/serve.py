"""`s5 bench serve --sessions 1,2,4`: a real server on a loopback port (or any running one: `--url`) and N clients
at once, each asking for the benchmark sentences one after another over POST /v1/audio/speech (PCM); each client
plays what arrives on a real-time player clock, so a late piece of audio is an underrun the listener would hear.
A client whose request fails on the way (a refused connection, a cut stream, a 502/503 from a proxy whose replica
died) asks again, as an app would, up to `RETRIES` times: each is a reconnect, counted. `idle` more connections are
held open, doing nothing, for the whole run (clients that connected and went quiet).

By default every client asks for the same sentences in the same order and all start at once: the first sentences
open every stream together (16 at 16 sessions), the worst case for the first sound; later ones drift apart, as each
client asks for its next sentence once the last one's audio has all arrived. With `spread` client i
starts at sentence i of the list, `i / n` of `SPREAD_S` after the first, so openings come as independent clients'
would (`client_plans`). Beside what the clients hear, each run reports what the server's worker spent (decoder
passes and renders per second of audio) and where the engine's side of the first sounds went (`opening_ms`)."""
from __future__ import annotations

import asyncio
import time

import numpy as np

from audio_io.sinks import ClockSink
from tts.inference.batching import StreamWorker
from tts.inference.synthesis import TTSBundle

from agent.serve.server import SERVICE, ServeConfig, create_app
from tts.eval.stream_bench import percentile as pct


RETRIES = 3
SPREAD_S = 1.0  # with `spread`, the clients' starts are spread over this long


def client_plans(sentences: list[str], n: int, spread: bool) -> list[tuple[float, list[str]]]:
    """Each of `n` clients' (delay before its first request in seconds, the sentences it asks for in order): all at
    once and in the same order, or (`spread`) each starting at its own sentence of the list, its start delayed by its
    share of `SPREAD_S`."""
    if not spread:
        return [(0.0, list(sentences)) for _ in range(n)]
    return [(SPREAD_S * i / n, sentences[i % len(sentences):] + sentences[: i % len(sentences)]) for i in range(n)]


class _Retry(Exception):
    pass


class _KeptResults:
    """A server's metrics that also keep every finished request's `SpeechResult` (the bench's own server only): the
    engine's side of each first sound (`SpeechResult.opening_ms`)."""

    def __init__(self, metrics):
        self.metrics, self.results = metrics, []

    def speech(self, result) -> None:
        self.results.append(result)
        self.metrics.speech(result)

    def __getattr__(self, name: str):
        return getattr(self.metrics, name)


def opening_parts(results: list) -> dict[str, list[float]]:
    """p50 and p95 (ms) of each part of the requests' first sounds (`SpeechResult.opening_ms`), where any spoke."""
    parts = [opening for opening in (result.opening_ms for result in results) if opening is not None]
    if not parts:
        return {}
    columns = {part: [p[part] for p in parts] for part in parts[0]}
    return {part: [round(pct(ms, 50), 1), round(pct(ms, 95), 1)] for part, ms in columns.items()}


async def _speak(session, url: str, text: str, model: str, headers: dict | None) -> ClockSink | None:
    """One sentence played on a real-time player clock; None: refused for good; _Retry: ask again."""
    import aiohttp

    try:
        async with session.post(url, json={"model": model, "input": text, "response_format": "pcm"},
                                headers=headers) as response:
            if response.status in (502, 503, 504):
                await response.read()
                raise _Retry
            if response.status != 200:
                await response.read()
                return None
            rate = int(response.headers["X-Sample-Rate"])
            player = ClockSink(rate, pace=False)
            player.begin_turn()
            leftover = b""
            async for piece in response.content.iter_any():
                data = leftover + piece
                cut = len(data) // 2 * 2
                leftover = data[cut:]
                if cut:
                    player.write(np.frombuffer(data[:cut], "<i2").astype(np.float32) / 32768)
            player.end_turn()
            return player
    except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError):
        raise _Retry from None


async def _client(session, url: str, sentences: list[str], model: str, headers: dict | None = None,
                  delay_s: float = 0.0) -> dict:
    firsts, underruns, errors, audio_s, wall_s, reconnects = [], 0, 0, 0.0, 0.0, 0
    await asyncio.sleep(delay_s)
    for text in sentences:
        started = time.perf_counter_ns()
        player = None
        for attempt in range(RETRIES + 1):
            try:
                player = await _speak(session, url, text, model, headers)
                break
            except _Retry:
                if attempt < RETRIES:
                    reconnects += 1
                    await asyncio.sleep(0.2 * (attempt + 1))
        if player is None:
            errors += 1
            continue
        wall_s += (time.perf_counter_ns() - started) / 1e9
        stats = player.stats
        if stats.first_audible_ns is not None:
            firsts.append((stats.first_audible_ns - started) / 1e6)
        underruns += stats.underruns
        audio_s += stats.played_samples / player.sample_rate
    return {"firsts": firsts, "underruns": underruns, "errors": errors, "audio_s": audio_s, "wall_s": wall_s,
            "reconnects": reconnects}


async def _idle_connections(url: str, n: int) -> list:
    """`n` connections that sent half a request and went quiet."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    writers = []
    for _ in range(n):
        _, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        writer.write(f"GET /health HTTP/1.1\r\nHost: {parts.hostname}\r\n".encode())
        writers.append(writer)
    return writers


async def bench_serve(bundles: dict[str, TTSBundle] | None, sentences: list[str], session_counts: list[int],
                      model: str = "s5", progress=None, batch_decode: bool = True, worker_threads: int = 2,
                      url: str | None = None, token: str | None = None, idle: int = 0,
                      renders: str | None = None, spread: bool = False) -> dict:
    """`url`: measure that running server (standalone or behind any proxy) instead of starting one here; its CPU
    time is then not this process's to count. `renders`: where the server's worker renders
    (`tts/inference/batching.RENDER_MODES`; None: as `s5 serve`). `spread`: the clients start apart, each at its own
    sentence (`client_plans`)."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    runs = []
    headers = {"Authorization": f"Bearer {token}"} if token else None
    task = progress.add_task("bench serve", total=len(session_counts)) if progress else None
    for n in session_counts:
        server = None
        if url is None:
            server = TestServer(create_app(bundles, ServeConfig(max_sessions=max(n, 1), batch_decode=batch_decode,
                                                                 worker_threads=worker_threads, renders=renders)))
            await server.start_server()
        base = url.rstrip("/") if url else str(server.make_url("")).rstrip("/")
        quiet = await _idle_connections(base, idle)
        worker = server.app[SERVICE].worker if server is not None else None
        if server is not None:
            kept = server.app[SERVICE].metrics = _KeptResults(server.app[SERVICE].metrics)
        cpu_started = time.process_time()
        try:
            async with ClientSession() as session:
                speech = base + "/v1/audio/speech"
                results = await asyncio.gather(*(_client(session, speech, texts, model, headers, delay_s)
                                                 for delay_s, texts in client_plans(sentences, n, spread)))
        finally:
            for writer in quiet:
                writer.close()
            if server is not None:
                await server.close()
        cpu_s = None if url else time.process_time() - cpu_started
        firsts = [f for r in results for f in r["firsts"]]
        audio, wall = sum(r["audio_s"] for r in results), max(r["wall_s"] for r in results)
        runs.append({"sessions": n, "first_audible_ms_p50": pct(firsts, 50), "first_audible_ms_p95": pct(firsts, 95),
                     "underruns": sum(r["underruns"] for r in results), "errors": sum(r["errors"] for r in results),
                     "reconnects": sum(r["reconnects"] for r in results),
                     # wall time over audio served per session: above 1, the sessions no longer keep real time
                     "rtf": round(wall / (audio / n), 3) if audio else None,
                     # the whole process's CPU seconds (every thread, the clients' too) per second of audio served
                     "cpu_s_per_audio_s": round(cpu_s / audio, 3) if audio and cpu_s is not None else None,
                     # the worker's rendering (the codec decoder and the vocoder) per second of audio served: how
                     # well renders batch, steadier than CPU time on a VM whose speed drifts (docs/results.md)
                     "render_ms_per_audio_s": round(worker.stats.render_s * 1e3 / audio, 1)
                     if audio and worker is not None else None,
                     # the worker's decoder passes, the same way: what a change to the decoder's step saves
                     "decode_ms_per_audio_s": round(worker.stats.step_s * 1e3 / audio, 1)
                     if audio and worker is not None else None,
                     # where the engine's side of the first sounds went, part by part: [p50, p95] ms each
                     "opening_ms": opening_parts(kept.results) if server is not None else None})
        if progress:
            progress.advance(task)
    clean = [r["sessions"] for r in runs if r["underruns"] == 0 and r["errors"] == 0]
    if url is not None or not batch_decode:
        renders = None  # not this bench's worker, or none at all
    else:
        renders = renders or StreamWorker.for_renders(worker_threads).renders
    return {"model": model, "sentences": len(sentences), "spread": spread, "batch_decode": batch_decode,
            "renders": renders, "url": url, "idle": idle, "runs": runs, "streams_real_time": max(clean, default=0)}
