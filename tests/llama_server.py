"""llama-cpp-python's own OpenAI-compatible server (`python -m llama_cpp.server`), started by tests on a loopback port.

Run as `python -m tests.llama_server --model GGUF --port N ...` (the server's own flags): the same server, with
ggml's extra weight layouts off where the CPU has AMX, as `llm/embedded.py` loads the model (with them this
llama.cpp build segfaults in the first decode on such a CPU)."""
from __future__ import annotations

import runpy
import subprocess
import sys
import time

import httpx

from llm.embedded import _extra_buffer_types, cpu_has_amx, model_path
from tests.ollama_standin import free_port


def start_server(n_ctx: int = 512) -> tuple[subprocess.Popen, str]:
    """The server on a free loopback port, serving the embedded Gemma as "gemma"; returns it and its base URL."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tests.llama_server", "--model", str(model_path()), "--model_alias",
                               "gemma", "--chat_format", "gemma", "--n_ctx", str(n_ctx), "--host", "127.0.0.1", "--port",
                               str(port), "--verbose", "False"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            time.sleep(0.3)
    server.kill()
    raise RuntimeError(f"llama-cpp-python's server did not start: {server.stderr.read().decode()[-500:]}")


if __name__ == "__main__":
    with _extra_buffer_types(allowed=not cpu_has_amx()):
        runpy.run_module("llama_cpp.server", run_name="__main__")
