"""LLM pieces to words: whatever the cuts, the words are the text's words, none split or merged."""
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.segmenter import WordSegmenter
from tts.frontend.text import TextNormalizer, normalize_text

TEXT = st.text(alphabet=st.sampled_from(list("ab,.!? \n\t'-`é😀\r\u00a0")), max_size=120)


def segment(text: str, cuts: list[int]):
    seg, words = WordSegmenter(), []
    points = sorted(set(c for c in cuts if 0 < c < len(text)))
    for a, b in zip([0] + points, points + [len(text)]):
        words += seg.push(text[a:b], 0)
    return words + seg.flush(0)


@given(TEXT, st.lists(st.integers(min_value=0, max_value=120), max_size=30))
def test_words_are_the_texts_words_whatever_the_cuts(text, cuts):
    words = segment(text, cuts)
    assert [w.text for w in words] == text.split()
    expected_line_starts = [i == 0 for line in text.split("\n") for i, _ in enumerate(line.split())]
    # a word that starts a line (or the text) is marked as such, every other one is not
    assert [w.line_start for w in words] == expected_line_starts


def test_a_word_is_released_only_when_whitespace_follows():
    seg = WordSegmenter()
    assert seg.push("Hel", 1) == [] and seg.push("lo", 2) == [] and seg.push(",", 3) == []
    (word,) = seg.push(" wor", 4)
    assert (word.text, word.t_ns) == ("Hello,", 4)
    assert seg.push("ld", 5) == []
    assert [w.text for w in seg.flush(6)] == ["world"] and seg.flush(7) == []


def test_whitespace_and_punctuation_edge_cases():
    assert [w.text for w in segment("  \n\n ", [])] == []
    assert [w.text for w in segment("...!!! ?", [1, 3])] == ["...!!!", "?"]
    words = segment("- item one\n- item two", [3, 9, 12])
    assert [(w.text, w.line_start) for w in words] == [("-", True), ("item", False), ("one", False), ("-", True), ("item", False), ("two", False)]


SENTENCES = [line.replace("\\n", "\n") for line in (Path(__file__).parent.parent / "data" / "sentences_200.txt").read_text().splitlines()]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SENTENCES), st.lists(st.integers(min_value=0, max_value=400), max_size=60))
def test_streamed_reply_is_spoken_as_the_whole_text(text, cuts):
    """The live text path (LLM pieces cut anywhere -> segmenter -> normaliser, as the orchestrator runs it) speaks
    the words that normalising the whole reply gives: numbers, currency, markdown and line starts included."""
    normalizer, spoken = TextNormalizer(), []
    for word in segment(text, cuts):
        spoken += normalizer.push(word.text, word.line_start)
    assert spoken == normalize_text(text)


# Any Unicode at all (surrogates, control and format characters, RTL marks, digits of every script), with the
# pieces LLMs send: line breaks of every convention, markdown, 10,000-letter words.
ANY_TEXT = st.lists(st.text(st.characters(), max_size=40) | st.sampled_from(
    ["\r\n", "\r", "\n", "\u200f", "\u202e", "\u2066", "٣٤", "߃", "𝟘𝟙", "\x00", "\ud800", "```py\n", "**", "- ", "# ",
     "a" * 10_000, " $4.50 ", " 20% ", " 3:30 pm ", "½", "H₂O", "😀", "Привет", "你好", "مرحبا"]), max_size=8).map("".join)


@settings(max_examples=300, deadline=None)  # 1,000 ran once (all passed, 7 min on a loaded machine); CI runs 300
@given(ANY_TEXT, st.lists(st.integers(min_value=0, max_value=10_300), max_size=25))
def test_any_unicode_streams_into_the_model_as_the_whole_text(tiny_bundle, text, cuts):
    """segmenter -> normaliser -> G2P -> the synthesizer's push_word: nothing raises, and the words streamed at
    random cut points are those of normalising the whole text."""
    from tts.inference.synthesis import SynthesisConfig, UtteranceSynthesizer

    normalizer, spoken = TextNormalizer(), []
    for word in segment(text, cuts):
        spoken += normalizer.push(word.text, word.line_start)
    assert spoken == normalize_text(text)
    synth = UtteranceSynthesizer(tiny_bundle(2), SynthesisConfig(seed=0))
    for word in spoken:
        synth.push_word(word)
    synth.end()
