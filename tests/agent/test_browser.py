"""The `s5 serve` page in headless Chromium (Debian's, driven by selenium; no browser download): type a question,
the page streams the spoken answer through its AudioWorklet and shows the turn's record. A screenshot is kept
($S5_ARTIFACTS, else the test's temporary folder)."""
import asyncio
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from agent.server import ServeConfig, create_app
from llm.replay import ReplayLLM, ReplayScript


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def server(tiny_bundle):
    from aiohttp import web

    script = {"name": "page", "llm": {"first_token_ms": 20, "tokens_per_second": 100},
              "turns": [{"user": "hi", "assistant": "Hello from the browser page, nice to meet you."}]}
    app = create_app({"s5": tiny_bundle(2), "t5": tiny_bundle(None)}, ServeConfig(),
                     lambda: ReplayLLM(ReplayScript.from_dict(script)))
    port, loop, started = free_port(), asyncio.new_event_loop(), threading.Event()
    runner = web.AppRunner(app)

    def serve():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(10)
    yield f"http://127.0.0.1:{port}/"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.slow
def test_the_page_speaks_an_answer_in_headless_chromium(server, tmp_path):
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        if os.environ.get("CI"):
            pytest.fail("chromium / chromedriver missing: ./setup.sh installs them")
        pytest.skip("chromium not installed (./setup.sh installs it)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--autoplay-policy=no-user-gesture-required",
                 "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(server)
        deadline = time.time() + 20
        while driver.execute_script("return typeof player === 'undefined' || !player") and time.time() < deadline:
            time.sleep(0.1)  # the page has its audio graph once the server said "ready"
        driver.find_element(By.ID, "text").send_keys("hi\n")
        record = None
        while record is None and time.time() < deadline + 40:
            record = driver.execute_script("return window.lastRecord || null")
            time.sleep(0.2)
        shot = Path(os.environ.get("S5_ARTIFACTS") or tmp_path) / "serve_page.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shot))
        log = driver.find_element(By.ID, "log").text
    finally:
        driver.quit()
    assert record is not None and record["error"] is None and record["audio_s"] > 0 and record["e2e_ms"] is not None
    assert "Hello from the browser page" in log and "first sound" in log and shot.stat().st_size > 1000
