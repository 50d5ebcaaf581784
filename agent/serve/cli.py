"""`s5 serve`: the command line of the streaming speech server (`agent/serve/server.py`)."""
from __future__ import annotations

import argparse

from agent.serve.loading import ServerOptions, load_server
from agent.settings import add_settings_arguments
from audio_io.errors import UserError
from tts.cli import err, notice


def _serve(args: argparse.Namespace) -> int:
    from agent.settings import settings_for

    settings = settings_for("serve", args)
    options = ServerOptions.from_args(args)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.token:
        notice(f"serving on {args.host} without --token: anyone who can reach it can use it")
    if args.ray is not None:
        from agent.serve.ray_serve import RayOptions, serve_on_ray

        return serve_on_ray(settings, options, RayOptions.from_args(args))
    from aiohttp import web

    from agent.serve.server import create_app

    app = create_app(*load_server(settings, options))
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
    serve.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                       help="deploy on a Ray cluster as a Ray Serve application: ADDRESS of the cluster (auto: the "
                       "running one); no ADDRESS: start a local one (`pip install s5-agent[cluster]`)")
    serve.add_argument("--replicas", type=int, default=1, help="with --ray: replicas, each loading the models once")
    serve.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                       help="with --ray: scale between MIN and MAX replicas on their live conversations")
    serve.set_defaults(func=_serve)
