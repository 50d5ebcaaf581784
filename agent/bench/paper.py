"""`s5 bench paper`: the paper's lookahead table on our models. For each model (S5 with k = 1, 2, 3 and the
full-context T5): Whisper WER and Distill-MOS on unseen sentences, spoken as `s5 chat` speaks them (`s5 eval`), and
the first sound after word k + 1 and the E2E latency behind the same replayed LLM stream (`s5 bench e2e`)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from agent.bench.e2e import bench_e2e
from llm.replay import ReplayScript
from tts.eval.evaluate import evaluate
from tts.inference.streaming import MODELS_DIR, load_bundle


@dataclass
class PaperModel:
    name: str  # the table's row
    directory: Path  # exported weights
    mode: str  # how it streams: s5 (word by word, k words of lookahead) or t5 (the whole reply first)


PAPER_MODELS = [
    PaperModel("S5 k=1", MODELS_DIR / "s5_k1", "s5"),
    PaperModel("S5 k=2 (shipped)", MODELS_DIR / "s5_default", "s5"),
    PaperModel("S5 k=3", MODELS_DIR / "s5_k3", "s5"),
    PaperModel("T5 (full context)", MODELS_DIR / "t5_default", "t5"),
]


def bench_paper(models: list[PaperModel], sentences: list[str], script: ReplayScript, progress=None,
                vocoder: str | None = None) -> dict:
    """One row per model; every model speaks the same sentences with the same seeds, behind the same LLM stream,
    voiced by `vocoder` (None: the codec's own)."""
    bundles = [load_bundle(model.mode, model.directory, vocoder=vocoder) for model in models]  # a missing model
    # fails before any work
    rows = []
    for model, bundle in zip(models, bundles):
        quality = evaluate(bundle, sentences, mode=model.mode, progress=progress)
        latency = asyncio.run(bench_e2e(script, {model.mode: bundle}, modes=(model.mode,), progress=progress,
                                        barge_in=False))[model.mode]
        rows.append({
            "model": model.name, "lookahead_words": bundle.model.config.lookahead_words,
            "wer": quality["wer"], "wer_reference": quality["wer_reference"], "distillmos": quality["distillmos"],
            "dnsmos": quality["dnsmos"],
            # s5: after word k + 1 arrived; t5: after the reply ended (the first moment each may start)
            "first_sound_ms_p50": latency["e2e_minus_floor_ms_p50"], "first_sound_ms_p95": latency["e2e_minus_floor_ms_p95"],
            "e2e_ms_p50": latency["e2e_p50_ms"], "e2e_ms_p95": latency["e2e_p95_ms"],
            "underruns": latency["underruns"], "errors": latency["errors"],
        })
    return {"sentences": len(sentences), "script": script.name, "first_token_ms": script.first_token_ms,
            "tokens_per_second": script.tokens_per_second, "models": rows}
