"""The orchestrator end to end: replayed or Ollama-protocol LLM streams, the real (tiny random) model and codec,
a real-time null sink. Checks the record, failures mid-reply, barge-in, and hostile input."""
import asyncio

import pytest

from agent.orchestrator import Agent, AgentConfig
from audio_io.sinks import ClockSink
from llm.ollama_backend import OllamaLLM
from llm.replay import ReplayLLM, ReplayScript
from tests.ollama_standin import free_port, start
from tts.frontend.text import normalize_text
from tts.inference.synthesis import SynthesisConfig


@pytest.fixture(scope="module")
def bundles(tiny_bundle):
    t5 = tiny_bundle(None)
    return {"s5": tiny_bundle(2), "t5": t5, "sentence": t5}


def make_agent(bundles, turns, mode="s5", pace=False, frames=4, **llm):
    script = ReplayScript.from_dict({"name": "test", "llm": {"first_token_ms": 20, "tokens_per_second": 200, **llm},
                                     "turns": [{"user": u, "assistant": a} for u, a in turns]})
    sink = ClockSink(22050, pace=pace)
    config = AgentConfig(tts_mode=mode, synthesis=SynthesisConfig(seed=0, max_frames_per_word=frames))
    return Agent(ReplayLLM(script), bundles, sink, config), sink


@pytest.mark.parametrize("mode", ["s5", "t5", "sentence"])
def test_a_turn_end_to_end_fills_its_record_in_order(bundles, mode):
    reply = "Sure! The meeting is at 3:30 pm. Bring **two** copies."
    agent, _ = make_agent(bundles, [("When is the meeting?", reply)], mode)
    record = asyncio.run(agent.run_turn("When is the meeting?"))
    assert record.error is None and not record.cancelled and record.reply == reply
    assert record.synthesis.spoken_words == len(normalize_text(reply))
    stamps = [record.stamp(name) for name in ("request_sent", "first_token", "first_word", "word_k1_arrived",
                                              "first_codec_frame", "first_audio_chunk")]
    assert None not in stamps and stamps == sorted(stamps)
    assert record.stamp("last_audio") >= record.stamp("first_audio_chunk")
    assert record.synthesis.audio_s > 0 and record.synthesis.frames > 0
    assert agent.history[-1] == {"role": "assistant", "content": reply}


def test_a_code_block_breaks_the_word_stream_where_it_opens(bundles):
    """The words before a skipped code block need not wait for their lookahead words after it (a stall of all its
    tokens): a break goes to the engine where the fence opens; every spoken word still arrives once."""
    from agent.orchestrator import END
    from llm.base import Piece
    from tts.inference.streaming import SEGMENT_BREAK

    reply = "Use the print function:\n\n```python\nprint(1)\n```\n\nRun it."

    async def spoken() -> list[str]:
        pieces: asyncio.Queue = asyncio.Queue()
        for token in reply.split(" "):
            pieces.put_nowait(Piece(token + " ", 0))
        pieces.put_nowait(END)
        return [w async for w in Agent._spoken_words(pieces)]

    words = asyncio.run(spoken())
    assert words == ["Use", "the", "print", "function:", SEGMENT_BREAK, "Run", "it."]
    agent, _ = make_agent(bundles, [("How?", reply)])
    record = asyncio.run(agent.run_turn("How?"))
    assert record.error is None and record.synthesis.spoken_words == 6 and record.synthesis.audio_s > 0


def test_history_is_sent_with_the_next_turn(bundles):
    agent, _ = make_agent(bundles, [("Hi", "Hello."), ("Again", "Hello again.")])

    async def two():
        await agent.run_turn("Hi")
        return agent.messages_for("Again")

    messages = asyncio.run(two())
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]


def test_llm_dying_mid_reply_ends_the_turn_cleanly_and_speaks_what_arrived(bundles):
    async def scenario():
        port = free_port()
        runner = await start(port)
        llm = OllamaLLM("error-mid", f"http://127.0.0.1:{port}")
        agent = Agent(llm, bundles, ClockSink(22050, pace=False), AgentConfig(synthesis=SynthesisConfig(seed=0, max_frames_per_word=4)))
        try:
            return await agent.run_turn("Capital of France?")
        finally:
            await llm.close()
            await runner.cleanup()

    record = asyncio.run(scenario())
    assert record.error.startswith("Ollama reported an error mid-reply") and "\n" not in record.error
    assert record.reply == "Sure, the capital" and record.synthesis.spoken_words == 3 and record.synthesis.audio_s > 0


def test_barge_in_stops_speech_flushes_audio_and_the_next_turn_works(bundles):
    long_reply = " ".join(["This reply goes on and on."] * 30)
    agent, sink = make_agent(bundles, [("Talk", long_reply), ("Stop", "Okay.")], pace=True, frames=6,
                             tokens_per_second=10)  # 21 s of text: far longer than the first audio takes, even on a busy machine

    async def scenario():
        turn = asyncio.create_task(agent.run_turn("Talk"))
        while sink.stats.played_samples == 0:
            await asyncio.sleep(0.01)
        agent.interrupt()
        first = await turn
        played_until = sink.stats.last_sample_ns
        second = await agent.run_turn("Stop")
        return first, played_until, second

    first, played_until, second = asyncio.run(scenario())
    assert first.cancelled and first.synthesis.spoken_words < len(normalize_text(long_reply))
    assert first.interrupted_at is not None and first.silenced >= first.interrupted_at and first.barge_in_ms >= 0
    assert played_until <= first.silenced  # nothing left to play after the silence stamp
    assert second.error is None and not second.cancelled and second.synthesis.spoken_words == 1
    assert second.barge_in_ms is None  # no interruption, no figure


def test_after_a_barge_in_the_history_keeps_the_words_heard_marked(bundles):
    """Interrupted once the player has played past the third word's start: the assistant turn the next request
    sends is the reply's written words up to the one sounding then (3, give or take one), marked as
    interrupted; the record counts the words written and heard."""
    import time

    from agent.orchestrator import INTERRUPTED_MARK

    reply = "It costs $12 today, and the shop on Main Street closes at nine tonight, so please hurry up."
    agent, sink = make_agent(bundles, [("Price?", reply), ("Again?", "Twelve.")], pace=True, frames=6,
                             tokens_per_second=40)

    async def scenario():
        turn = asyncio.create_task(agent.run_turn("Price?"))
        while True:  # the words as a client learns of them, against what the player has played by now
            record = agent.turn_record
            started = record.synthesis.words_started if record and record.synthesis else []
            first_ns = sink.stats.first_played_ns
            if len(started) >= 4 and first_ns and time.perf_counter_ns() - first_ns > (started[2].start_s + 0.03) * 1e9:
                break
            await asyncio.sleep(0.005)
        agent.interrupt()
        first = await turn
        return first, agent.messages_for("Again?")

    first, messages = asyncio.run(scenario())
    assistant = messages[-2]["content"]
    assert first.cancelled and messages[-3] == {"role": "user", "content": "Price?"}
    assert assistant.endswith(INTERRUPTED_MARK)
    heard = assistant.removesuffix(INTERRUPTED_MARK).split()
    assert reply.startswith(" ".join(heard)) and 2 <= len(heard) <= 4  # "It costs $12", give or take a word
    assert first.words_written > first.words_heard >= 3 and first.to_json()["words_heard"] == first.words_heard


HOSTILE = [
    "", " ", "\n\n", "😀😀😀", "🎉 Done! ✅", "**bold** _italic_ ~~strike~~ `code`", "# Heading\n## Sub", "- a\n- b\n* c",
    "```\nprint('hi')\n```", "```python\nfor i in range(3):\n    pass", "Supercalifragilisticexpialidocious" * 5,
    "a" * 300, "日本語のテキストです。", "Привет, как дела?", "مرحبا بالعالم", "Ελληνικά γράμματα", "שלום",
    "<script>alert(1)</script>", "https://example.com/a?b=c&d=e", "mail me: someone@example.org", "$1,000,000.99",
    "100%", "-42", "3.14159265358979", "1e309", "12:61 pm", "99:99", "2026-13-45", "1st 2nd 3rd 4th 101st",
    "\x00\x01\x07 control", "\u200b\u200d zero width", "tab\tseparated\tvalues", "|a|b|\n|-|-|\n|1|2|", "> quote",
    "...", "?!?!", "--- *** ___", "C++ & C# vs. F#", "¯\\_(ツ)_/¯", "Dr. St. Mr. etc.", "e.g. i.e. vs",
    "NaN inf", "0x1F 0b101", "#hashtag @mention", "[link](http://x.y)", "![img](a.png)", "\\n literal", "{json: [1, 2]}",
]


def test_a_hundred_hostile_replies_never_raise(bundles):
    texts = (HOSTILE * 3)[:100]
    agent, _ = make_agent(bundles, [(f"q{i}", t) for i, t in enumerate(texts)], frames=2, first_token_ms=0, tokens_per_second=5000)

    async def all_turns():
        return [await agent.run_turn(f"q{i}") for i in range(len(texts))]

    records = asyncio.run(all_turns())
    assert len(records) == 100
    assert all(r.error is None and not r.cancelled for r in records)
    spoken = [r for r in records if r.synthesis.spoken_words]
    assert all(r.synthesis.audio_s > 0 for r in spoken)


def test_a_bug_in_one_turn_ends_that_turn_only(bundles, monkeypatch, caplog):
    """A stage that raises (not an LLM error: a bug) gives its turn a one-line error and logs the traceback; the
    conversation goes on with the next turn."""
    from tts.frontend.text import TextNormalizer

    pushed = TextNormalizer.push

    def buggy(self, word, line_start=False):
        if word.startswith("Boom"):
            raise KeyError("a normaliser bug")
        return pushed(self, word, line_start)

    monkeypatch.setattr(TextNormalizer, "push", buggy)
    agent, _ = make_agent(bundles, [("one", "Fine. Boom goes the word."), ("two", "Still here, all good.")])

    async def both():
        return await agent.run_turn("one"), await agent.run_turn("two")

    with caplog.at_level("ERROR", logger="s5"):
        failed, next_turn = asyncio.run(both())
    assert failed.error.startswith("this turn failed: KeyError") and "\n" not in failed.error
    assert not failed.cancelled and "a normaliser bug" in caplog.text and "Traceback" in caplog.text
    assert next_turn.error is None and next_turn.synthesis.spoken_words == len(normalize_text("Still here, all good."))


def test_soak_summary_reports_memory_growth_and_latency_drift():
    from agent.records import TurnRecord
    from agent.replay import ReplayResult, soak_summary

    records = []
    for i in range(40):
        record = TurnRecord(i + 1, "s5", "replay", "q")
        record.request_sent, record.playback.first_audible_ns = 0, int((500 + (100 if i >= 30 else 0)) * 1e6)
        records.append(record)
    rss = [100.0 + (1.0 if i >= 3 else 0.0) for i in range(40)]  # warm-up growth is not counted
    rss[-1] = 102.0
    soak = soak_summary(ReplayResult("s", "s5", records, [], rss))
    assert soak["warmup_turns"] == 5 and soak["rss_mb_after_warmup"] == 101.0 and soak["rss_growth_pct"] == pytest.approx(0.99)
    assert soak["e2e_p50_ms_first_quarter"] == 500.0 and soak["e2e_p50_ms_last_quarter"] == 600.0 and soak["e2e_drift_ms"] == 100.0


def test_a_spoken_turn_records_voice_to_voice_latency(bundles):
    import time

    from agent.listen import HeardLine

    agent, _ = make_agent(bundles, [("What time is it?", "It is half past three.")])
    now = time.perf_counter_ns()
    heard = HeardLine("What time is it?", now - int(1.5e9), now - int(0.6e9), now)
    record = asyncio.run(agent.run_turn(heard.text, heard=heard))
    turn_ms = (time.perf_counter_ns() - now) / 1e6
    assert record.user_speech_end == heard.speech_end_ns and record.transcript_ready == now
    # the speech ended 600 ms before the turn began, and the answer sounded during the turn
    assert 600 < record.voice_to_voice_ms < 600 + turn_ms and "voice-to-voice" in record.summary_line()
    assert record.to_json()["voice_to_voice_ms"] == record.voice_to_voice_ms


def test_a_turn_started_on_a_guess_is_silent_until_confirmed_and_a_retracted_one_is_forgotten(bundles):
    """Spoken turn-taking (`SpokenTurns`, shared by `s5 chat --voice` and `s5 bench voice`): a guess starts the turn
    held; its final line lets it play; speech that resumes drops it unheard and out of the history."""
    import time

    from agent.listen import HeardLine, SpeechResumed
    from agent.chat import SpokenTurns

    agent, sink = make_agent(bundles, [("Is it raining?", "No, it is dry today."), ("Is it raining in Oslo?", "Yes, a little.")])
    spoken = SpokenTurns(agent, full_duplex=True)

    async def run():
        now = time.perf_counter_ns()
        guess = HeardLine("Is it raining?", now - int(1e9), now - int(0.3e9), now, guess=True)
        assert spoken.on_event(guess, speaking=False) is guess
        turn = asyncio.create_task(spoken.run_turn(guess.text, guess))
        while not sink._waiting and not turn.done():  # until the reply's sound reaches the (held) player
            await asyncio.sleep(0.01)
        assert sink._waiting and not turn.done() and sink.stats.first_played_ns is None  # held, none of it played
        confirmed = time.perf_counter_ns()
        final = HeardLine(guess.text, guess.speech_start_ns, guess.speech_end_ns, confirmed)
        assert spoken.on_event(final, speaking=True) is None  # it confirms, it does not start another turn
        first = await turn
        assert first.started_on_guess and not first.retracted
        assert sink.stats.first_played_ns >= confirmed and first.stamp("first_audible_sample") >= confirmed

        guess2 = HeardLine("Is it raining", now, now + int(0.5e9), time.perf_counter_ns(), guess=True)
        spoken.on_event(guess2, speaking=False)
        turn = asyncio.create_task(spoken.run_turn(guess2.text, guess2))
        await asyncio.sleep(0.2)
        assert spoken.on_event(SpeechResumed(time.perf_counter_ns()), speaking=True) is None
        second = await turn
        assert second.retracted and second.cancelled and sink.stats.first_played_ns is None
        return first

    first = asyncio.run(run())
    assert [m["content"] for m in agent.history] == [first.user, first.reply]  # the retracted turn left no trace


def test_a_final_line_of_another_span_replaces_the_guess(bundles):
    """The utterance ended elsewhere than guessed (cut at the length limit): the held turn goes, the line is new."""
    import time

    from agent.listen import HeardLine
    from agent.chat import SpokenTurns

    agent, sink = make_agent(bundles, [("Is it", "Yes."), ("Is it raining today", "No.")])
    spoken = SpokenTurns(agent, full_duplex=False)

    async def run():
        now = time.perf_counter_ns()
        guess = HeardLine("Is it", now - int(1e9), now - int(0.5e9), now, guess=True)
        spoken.on_event(guess, speaking=False)
        turn = asyncio.create_task(spoken.run_turn(guess.text, guess))
        await asyncio.sleep(0.2)
        final = HeardLine("Is it raining today", guess.speech_start_ns, now, time.perf_counter_ns(), cut=True)
        assert spoken.on_event(final, speaking=True) is final  # even half-duplex: it is the user's line
        return await turn

    held = asyncio.run(run())
    assert held.retracted and held.started_on_guess and sink.stats.first_played_ns is None
