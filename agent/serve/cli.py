"""`s5 serve`: the command line of the streaming speech server (`agent/serve/server.py`)."""
from __future__ import annotations

import argparse

from agent.settings import add_settings_arguments
from audio_io.errors import UserError
from tts.cli import err, notice


def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from agent.chat import LLMChoice, load_bundles
    from agent.settings import settings_for
    from agent.orchestrator import AgentConfig
    from agent.serve.server import ServeConfig, create_app

    settings = settings_for("serve", args)

    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.token:
        notice(f"serving on {args.host} without --token: anyone who can reach it can use it")
    import torch

    torch.set_num_threads(1)  # the sessions' synthesis runs on the worker's threads (--threads)
    bundles = load_bundles(["s5", "t5"], vocoder=settings.tts.vocoder,
                           render_threads=1 if args.no_batch else args.threads)
    # each conversation its own LLM (the embedded model is not safe to share between sessions)
    llm_factory = LLMChoice.from_settings(settings.llm).new if settings.llm.backend != "none" else None
    app = create_app(bundles, ServeConfig(max_sessions=args.max_sessions, token=args.token, idle_timeout_s=args.idle_timeout,
                                          batch_decode=not args.no_batch, worker_threads=args.threads,
                                          turn=AgentConfig.from_settings(settings, "s5")), llm_factory)
    err.print(f"[green]s5 serve: http://{args.host}:{args.port}/health, POST /v1/audio/speech[/]")
    try:
        web.run_app(app, host=args.host, port=args.port, print=None)
    except OSError as error:  # port taken, address not ours
        raise UserError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}") from error
    return 0


def register(commands) -> None:
    serve = commands.add_parser("serve", help="streaming speech server: GET /health, POST /v1/audio/speech (OpenAI-style)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (use it off localhost)")
    serve.add_argument("--max-sessions", type=int, default=8, help="requests and conversations at once; more get a 503")
    serve.add_argument("--idle-timeout", type=float, default=300.0, help="seconds a silent conversation stays open")
    add_settings_arguments(serve, "serve")
    serve.add_argument("--no-batch", action="store_true",
                       help="each session runs on a thread of its own (default: one worker runs every session, their "
                       "decoder steps in one batched pass)")
    serve.add_argument("--threads", type=int, default=2, help="torch threads of the worker that runs every session's "
                       "synthesis (with --no-batch each session runs on a thread of its own with one)")
    serve.set_defaults(func=_serve)
