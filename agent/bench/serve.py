"""`s5 bench serve --sessions 1,2,4`: a real server on a loopback port (or any running one: `--url`) and N clients
at once, each asking for the benchmark sentences one after another over POST /v1/audio/speech (PCM); each client
plays what arrives on a real-time player clock, so a late piece of audio is an underrun the listener would hear."""
from __future__ import annotations

import asyncio
import time

import numpy as np

from audio_io.sinks import ClockSink
from tts.inference.synthesis import TTSBundle

from agent.serve.server import ServeConfig, create_app
from tts.eval.stream_bench import percentile as pct


async def _client(session, url: str, sentences: list[str], model: str, headers: dict | None = None) -> dict:
    firsts, underruns, errors, audio_s, wall_s = [], 0, 0, 0.0, 0.0
    for text in sentences:
        started = time.perf_counter_ns()
        async with session.post(url, json={"model": model, "input": text, "response_format": "pcm"},
                                headers=headers) as response:
            if response.status != 200:
                errors += 1
                await response.read()
                continue
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
        wall_s += (time.perf_counter_ns() - started) / 1e9
        stats = player.stats
        if stats.first_audible_ns is not None:
            firsts.append((stats.first_audible_ns - started) / 1e6)
        underruns += stats.underruns
        audio_s += stats.played_samples / rate
    return {"firsts": firsts, "underruns": underruns, "errors": errors, "audio_s": audio_s, "wall_s": wall_s}


async def bench_serve(bundles: dict[str, TTSBundle] | None, sentences: list[str], session_counts: list[int],
                      model: str = "s5", progress=None, batch_decode: bool = True, worker_threads: int = 2,
                      url: str | None = None, token: str | None = None) -> dict:
    """`url`: measure that running server (standalone or behind any proxy) instead of starting one here; its CPU
    time is then not this process's to count."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    runs = []
    headers = {"Authorization": f"Bearer {token}"} if token else None
    task = progress.add_task("bench serve", total=len(session_counts)) if progress else None
    for n in session_counts:
        server = None
        if url is None:
            server = TestServer(create_app(bundles, ServeConfig(max_sessions=max(n, 1), batch_decode=batch_decode,
                                                                 worker_threads=worker_threads)))
            await server.start_server()
        cpu_started = time.process_time()
        try:
            async with ClientSession() as session:
                speech = url.rstrip("/") + "/v1/audio/speech" if url else str(server.make_url("/v1/audio/speech"))
                results = await asyncio.gather(*(_client(session, speech, sentences, model, headers) for _ in range(n)))
        finally:
            if server is not None:
                await server.close()
        cpu_s = None if url else time.process_time() - cpu_started
        firsts = [f for r in results for f in r["firsts"]]
        audio, wall = sum(r["audio_s"] for r in results), max(r["wall_s"] for r in results)
        runs.append({"sessions": n, "first_audible_ms_p50": pct(firsts, 50), "first_audible_ms_p95": pct(firsts, 95),
                     "underruns": sum(r["underruns"] for r in results), "errors": sum(r["errors"] for r in results),
                     # wall time over audio served per session: above 1, the sessions no longer keep real time
                     "rtf": round(wall / (audio / n), 3) if audio else None,
                     # the whole process's CPU seconds (every thread, the clients' too) per second of audio served
                     "cpu_s_per_audio_s": round(cpu_s / audio, 3) if audio and cpu_s is not None else None})
        if progress:
            progress.advance(task)
    clean = [r["sessions"] for r in runs if r["underruns"] == 0 and r["errors"] == 0]
    return {"model": model, "sentences": len(sentences), "batch_decode": batch_decode, "url": url, "runs": runs,
            "streams_real_time": max(clean, default=0)}
