"""The `s5 serve` page in headless Chromium (Debian's, driven by selenium; no browser download): type a question,
the page streams the spoken answer through its AudioWorklet, shows the turn's record and draws its timeline. A screenshot is kept
($S5_ARTIFACTS, else the test's temporary folder)."""
import asyncio
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from agent.serve.server import ServeConfig, create_app
from llm.replay import ReplayLLM, ReplayScript


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def server(tiny_bundle):
    from aiohttp import web

    script = {"name": "page", "llm": {"first_token_ms": 20, "tokens_per_second": 100},
              "turns": [{"user": "hi", "assistant": "Hello from the browser page, nice to meet you."}] * 4}
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


def browser(fake_microphone: Path):
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        if os.environ.get("CI"):
            pytest.fail("chromium / chromedriver missing: ./setup.sh installs them")
        pytest.skip("chromium not installed (./setup.sh installs it)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--autoplay-policy=no-user-gesture-required",
                 "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                 f"--use-file-for-fake-audio-capture={fake_microphone}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def wait_for(driver, script: str, seconds: float):
    deadline, value = time.time() + seconds, None
    while not value and time.time() < deadline:
        value = driver.execute_script(script)
        time.sleep(0.1)
    return value


@pytest.mark.slow
def test_the_page_hears_a_spoken_question_and_speaks_the_answer_in_headless_chromium(server, tmp_path):
    """Typed first, then spoken: Chromium's fake microphone plays a question (flite's voice); the page sends it
    to the server, which hears it (VAD + Whisper) and answers; a screenshot of the page is kept."""
    import numpy as np
    from selenium.webdriver.common.by import By

    from audio_io.wav import write_wav
    from tts.data.voices import SAMPLE_RATE, VOICES

    question = VOICES["flite_kal"].synthesize("What is the capital of France?").audio
    fake = tmp_path / "question.wav"
    write_wav(fake, np.concatenate([np.zeros(SAMPLE_RATE // 2), question, np.zeros(3 * SAMPLE_RATE)]), SAMPLE_RATE)
    driver = browser(fake)
    try:
        driver.get(server)
        assert wait_for(driver, "return typeof player !== 'undefined' && !!player", 20)  # the server said "ready"
        driver.find_element(By.ID, "text").send_keys("hi\n")
        typed = wait_for(driver, "return window.lastRecord || null", 40)
        lit = wait_for(driver, f"return window.wordsLit.length >= {typed['spoken_words']} ? window.wordsLit : null", 20)
        spoken_line = driver.execute_script("return document.querySelector('.spoken').textContent")
        inked = driver.execute_script(  # the timeline canvas: pixels drawn after the turn
            "const c = document.getElementById('timeline'); const d = c.getContext('2d').getImageData(0, 0, c.width, "
            "c.height).data; let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; "
            "return [c.dataset.drawn, n, c.width * c.height];")
        driver.execute_script("window.lastRecord = null")
        driver.find_element(By.ID, "mic").click()
        spoken = wait_for(driver, "return window.lastRecord || null", 60)
        shot = Path(os.environ.get("S5_ARTIFACTS") or tmp_path) / "serve_page.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shot))
        log = driver.find_element(By.ID, "log").text
    finally:
        driver.quit()
    assert typed is not None and typed["error"] is None and typed["audio_s"] > 0 and typed["e2e_ms"] is not None
    assert lit and spoken_line.split()[1:] == lit  # each word of the reply lit as its sound played, in order
    assert inked[0] == "1" and 0.01 * inked[2] < inked[1] < 0.9 * inked[2]  # drawn, not blank, not a flood
    assert spoken is not None and spoken["error"] is None and spoken["voice_to_voice_ms"] is not None
    assert {"capital", "france"} <= set(spoken["user"].lower().replace("?", "").split())
    assert "you (spoken): What is the capital of France?" in log and "first sound" in log and shot.stat().st_size > 1000
