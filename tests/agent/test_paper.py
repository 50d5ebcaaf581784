"""`s5 bench paper`: one row per model, each with its own lookahead, judged and timed the same way."""
from pathlib import Path

from agent.bench import paper
from llm.replay import ReplayScript, ReplayTurn


def test_the_paper_table_has_a_row_per_model_with_its_own_lookahead(tiny_bundle, monkeypatch):
    bundles = {"k1": tiny_bundle(1), "k2": tiny_bundle(2), "k3": tiny_bundle(3), "t5": tiny_bundle(None)}
    monkeypatch.setattr(paper, "load_bundle", lambda mode, directory, vocoder=None: bundles[Path(directory).name])
    models = [paper.PaperModel(f"S5 k={k}", Path(f"k{k}"), "s5") for k in (1, 2, 3)]
    models.append(paper.PaperModel("T5", Path("t5"), "t5"))
    script = ReplayScript("paper", [ReplayTurn("hi", "Sure, the train leaves at noon from platform two.")],
                          first_token_ms=50, tokens_per_second=40)
    result = paper.bench_paper(models, ["The train leaves at noon."], script)
    rows = result["models"]
    assert [r["model"] for r in rows] == ["S5 k=1", "S5 k=2", "S5 k=3", "T5"]
    assert [r["lookahead_words"] for r in rows] == [1, 2, 3, None]
    for row in rows:
        assert row["errors"] == 0 and row["wer"] is not None and 1.0 <= row["distillmos"] <= 5.0
        assert row["first_sound_ms_p50"] is not None and row["e2e_ms_p50"] >= row["first_sound_ms_p50"]
    # the wait for text: T5 starts only once the reply has ended, S5 after k + 1 words
    assert rows[3]["e2e_ms_p50"] > rows[0]["e2e_ms_p50"]
