"""`s5 bench renders`: what a render costs per second of audio, by push length and streams rendered together."""
import torch

from tts.eval.codec_bench import render_costs


def test_render_costs_cover_every_push_length_and_stream_count(tiny_bundle):
    codec = tiny_bundle(2).codec
    with torch.inference_mode():
        result = render_costs(codec, push_lengths=(1, 4), stream_counts=(1, 3), frames=24)
    assert [row["push_frames"] for row in result["rows"]] == [1, 4]
    for row in result["rows"]:
        assert all(row[f"ms_per_audio_s_{n}_streams"] > 0 for n in (1, 3))
    # a push length the codes cannot fill past the warm-up has nothing timed: said, not divided by zero
    assert render_costs(codec, push_lengths=(16,), stream_counts=(1,), frames=24)["rows"][0]["ms_per_audio_s_1_streams"] is None
