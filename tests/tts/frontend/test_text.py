from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tts.frontend.g2p import G2P, SymbolTable
from tts.frontend.text import TextNormalizer, normalize_text

SENTENCES = [line.replace("\\n", "\n") for line in (Path(__file__).parents[2] / "data" / "sentences_200.txt").read_text().splitlines()]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("**Bold** and _italic_ text.", ["Bold", "and", "italic", "text."]),
        ("# Heading\n- item one\n2. item two", ["Heading", "item", "one", "item", "two"]),
        ("Before\n```python\nx = 1\n```\nafter.", ["Before", "after."]),
        ("Costs $5.20!", ["Costs", "five", "dollars", "and", "twenty", "cents!"]),
        ("Up 45% today", ["Up", "forty", "five", "percent", "today"]),
        ("See https://www.example.com/a?b=1.", ["See", "example", "dot", "com."]),
        ("Mail jo.li@mail.org now", ["Mail", "jo", "dot", "li", "at", "mail", "dot", "org", "now"]),
        ("At 3:05pm", ["At", "three", "oh", "five", "p", "m"]),
        ("On 2024-05-01.", ["On", "may", "first", "twenty", "twenty", "four."]),
        ("The 21st time", ["The", "twenty", "first", "time"]),
        ("Ran 5 km and 1 mi", ["Ran", "five", "kilometers", "and", "one", "mile"]),
        ("It weighs 2kg", ["It", "weighs", "two", "kilograms"]),
        ("In 1990 Dr. Who", ["In", "nineteen", "ninety", "doctor", "Who"]),
        ("Party 🎉 time 😀", ["Party", "time"]),
        ("Привет, café!", ["Privet,", "cafe!"]),
        ("... !!! ---", []),
        ("", []),
    ],
)
def test_normalizer(text, expected):
    assert normalize_text(text) == expected


def test_unknown_characters_are_dropped_with_a_warning(caplog):
    normalizer = TextNormalizer()
    assert normalizer.normalize("a ✓ b") == ["a", "b"] and "✓" in normalizer.dropped
    words = normalizer.normalize("x§y")
    assert words == ["x", "y"] and "§" in normalizer.dropped
    assert any("dropped" in r.message for r in caplog.records)


@pytest.fixture(scope="module")
def g2p():
    return G2P()


def test_g2p_from_several_threads_gives_each_its_own_words():
    """`s5 serve` runs two sessions' synthesis in two threads over one G2P: their calls must not mix."""
    from concurrent.futures import ThreadPoolExecutor

    batches = [text.split() for text in ("alpha bravo charlie delta echo", "foxtrot golf hotel india juliet",
                                         "kilo lima mike november oscar", "papa quebec romeo sierra tango",
                                         "uniform victor whiskey xray yankee", "zulu morning evening river stone")]
    expected = [G2P().word_symbols(batch) for batch in batches]
    for _ in range(3):
        shared = G2P()  # an empty cache: every call goes to espeak
        with ThreadPoolExecutor(len(batches)) as pool:
            assert list(pool.map(shared.word_symbols, batches)) == expected


def test_word_by_word_g2p_matches_whole_sentence(g2p):
    """The streaming path (normaliser fed piece by piece, a fresh G2P call per word, no cache) against the
    offline path (whole text normalised, all words phonemised in one espeak call): >= 98% of words identical."""
    same = total = 0
    for text in SENTENCES:
        words, offline = g2p.encode_text(text)
        normalizer, streaming = TextNormalizer(), []
        for line in text.splitlines():
            for i, piece in enumerate(line.split()):
                for word in normalizer.push(piece, line_start=i == 0):
                    fresh = G2P.__new__(G2P)
                    fresh.symbols, fresh._backend, fresh._cache, fresh._lock = g2p.symbols, g2p._backend, {}, g2p._lock
                    ids = fresh.encode_words([word])[0]
                    if ids:
                        streaming.append(ids)
        total += len(offline)
        same += sum(a == b for a, b in zip(offline, streaming)) if len(offline) == len(streaming) else 0
    assert total > 1500
    assert same / total >= 0.98, f"{same}/{total}"


def test_symbol_table_is_stable_and_round_trips(tmp_path, g2p):
    table = SymbolTable.default()
    assert table.symbols[:3] == ["<pad>", "<bos>", "<eos>"] and len(table) <= 128
    table.save(tmp_path / "symbols.json")
    assert SymbolTable.load(tmp_path / "symbols.json").symbols == table.symbols
    ids = g2p.encode_words(["hello,", "world!"])
    assert table.decode(ids[0])[-1] == "," and table.decode(ids[1])[-1] == "!"
    assert all(0 < i < len(table) for word in ids for i in word)


def test_every_sentence_phonemises(g2p):
    for text in SENTENCES:
        words, ids = g2p.encode_text(text)
        assert len(words) == len(ids) and all(ids)


@pytest.mark.parametrize("text,expected", [
    ("Water is H₂O and energy is mc².", ["Water", "is", "H", "two", "O", "and", "energy", "is", "mc", "squared."]),
    ("Add ½ cup and ¾ spoon, ⅓ more.", ["Add", "one", "half", "cup", "and", "three", "quarters", "spoon,", "one", "third", "more."]),
    ("Step ④ then ⒌ and ፪", ["Step", "four", "then", "five", "and", "two"]),
    ("It costs ٣٤ dollars", ["It", "costs", "thirty", "four", "dollars"]),
    ("x³ and 10⁵", ["x", "cubed", "and", "ten", "to", "the", "power", "of", "five"]),
])
def test_digits_of_every_kind_are_spoken(text, expected):
    assert normalize_text(text) == expected


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=60) | st.text(alphabet=st.characters(categories=["Nd", "No", "Nl", "Sm", "So", "Cf", "Zs"]), max_size=30))
def test_any_text_normalises_into_plain_words(text):
    """Arbitrary Unicode (digits and numbers of every script, format characters, symbols): no exception, and
    every word is speakable (no whitespace, nothing empty)."""
    for word in normalize_text(text):
        assert word and not any(c.isspace() for c in word)
