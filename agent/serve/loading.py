"""What one server process (the standalone server, or one Ray replica) loads once, from `s5 serve`'s flags and
the resolved settings (`agent/settings.py`)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass
class ServerOptions:
    """`s5 serve`'s own flags (the voice's and the LLM's settings come from `agent/settings.py`)."""
    max_sessions: int = 8
    token: str | None = None
    idle_timeout_s: float = 300.0
    batch_decode: bool = True
    threads: int = 2

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ServerOptions":
        return cls(args.max_sessions, args.token, args.idle_timeout, not args.no_batch, args.threads)


def load_server(settings, options: ServerOptions):
    """What one server process (or Ray replica) loads once: the voices, the LLM factory (None: no LLM) and the
    server's config."""
    import torch

    from agent.chat import LLMChoice, load_bundles
    from agent.orchestrator import AgentConfig
    from agent.serve.service import ServeConfig
    from tts.inference.batching import render_threads_for

    torch.set_num_threads(1)  # the sessions' synthesis runs on the worker's threads (--threads)
    bundles = load_bundles(["s5", "t5"], vocoder=settings.tts.vocoder,
                           render_threads=render_threads_for(options.threads) if options.batch_decode else 1)
    # each conversation its own LLM (the embedded model is not safe to share between sessions)
    llm_factory = LLMChoice.from_settings(settings.llm).new if settings.llm.backend != "none" else None
    config = ServeConfig(max_sessions=options.max_sessions, token=options.token, idle_timeout_s=options.idle_timeout_s,
                         batch_decode=options.batch_decode, worker_threads=options.threads,
                         turn=AgentConfig.from_settings(settings, "s5"))
    return bundles, config, llm_factory
