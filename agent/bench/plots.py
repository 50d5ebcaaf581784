"""Pictures of the benchmarks (matplotlib, PNG, only where the user asks with `--plot FILE`)."""
from __future__ import annotations

from pathlib import Path

from agent.records import TurnRecord

MODE_COLORS = {"s5": "#1b9e77", "t5": "#d95f02", "sentence": "#7570b3"}
WATERFALL = [  # stamp, label, marker
    ("first_token", "first token", "o"), ("first_word", "first word", "s"), ("word_k1_arrived", "synthesis may start", "D"),
    ("first_audio_chunk", "first chunk", "^"), ("first_audible_sample", "first audible", "*"),
    ("last_token", "last token", "v"), ("last_audio", "last audio", "X"),
]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def plot_e2e(by_mode: dict[str, list[TurnRecord]], path: Path, title: str = "") -> Path:
    """Top: per mode, the E2E latency (request to first audible sample) and the first sound after synthesis may
    start (s5: word k+1; t5: the reply's end; sentence: the first sentence's end), every turn a dot over a box.
    Bottom: one turn per mode (the first), its stamps on a time line, the audio as a bar from first audible to last."""
    plt = _pyplot()
    modes = [m for m in by_mode if by_mode[m]]
    fig = plt.figure(figsize=(11, 7.5), dpi=110)
    grid = fig.add_gridspec(2, 2, height_ratios=[1.1, 1])
    for column, (metric, label) in enumerate([("e2e_ms", "E2E: request to first audible (ms)"),
                                              ("e2e_minus_floor_ms", "first sound after synthesis may start (ms)")]):
        ax = fig.add_subplot(grid[0, column])
        values = [[getattr(r, metric) for r in by_mode[m] if getattr(r, metric) is not None] for m in modes]
        ax.boxplot(values, tick_labels=modes, widths=0.5, showfliers=False)
        for i, (mode, points) in enumerate(zip(modes, values), start=1):
            ax.scatter([i] * len(points), points, color=MODE_COLORS.get(mode, "black"), alpha=0.7, zorder=3, s=18)
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    ax = fig.add_subplot(grid[1, :])
    for row, mode in enumerate(modes):
        record = by_mode[mode][0]
        start, end = record.ms_after_request("first_audible_sample"), record.ms_after_request("last_audio")
        if start is not None and end is not None:
            ax.barh(row, end - start, left=start, height=0.35, color=MODE_COLORS.get(mode, "gray"), alpha=0.35)
        for stamp, label, marker in WATERFALL:
            t = record.ms_after_request(stamp)
            if t is not None:
                ax.scatter(t, row, marker=marker, s=60, color=MODE_COLORS.get(mode, "black"), zorder=3,
                           label=label if row == 0 else None)
    ax.set_yticks(range(len(modes)), modes)
    ax.invert_yaxis()
    ax.set_xlabel("ms after the request")
    ax.set_title(f"turn 1: \"{by_mode[modes[0]][0].user}\" (bar: the audio, first audible to last)", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncols=7, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title or "end to end, the same LLM stream through each mode")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_serve(runs: list[dict], path: Path, title: str = "") -> Path:
    """First audible p50 / p95 and underruns against concurrent sessions (`s5 bench serve`)."""
    plt = _pyplot()
    sessions = [r["sessions"] for r in runs]
    fig, left = plt.subplots(figsize=(8, 4.5), dpi=110)
    left.plot(sessions, [r["first_audible_ms_p50"] for r in runs], "o-", color="#1b9e77", label="first audible p50")
    left.plot(sessions, [r["first_audible_ms_p95"] for r in runs], "s--", color="#1b9e77", label="first audible p95")
    left.set_xlabel("concurrent sessions")
    left.set_ylabel("ms")
    left.set_xticks(sessions)
    right = left.twinx()
    right.bar(sessions, [r["underruns"] for r in runs], width=0.4, color="#d95f02", alpha=0.4, label="underruns")
    right.set_ylabel("underruns")
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    left.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)
    left.grid(alpha=0.3)
    fig.suptitle(title or "s5 serve under concurrent clients")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_attention(units: list, audio, sample_rate: int, path: Path, lookahead_words: int | None) -> Path:
    """Top: the decoder's cross-attention of every step of the first synthesis unit over its text tokens (words
    marked), with the lookahead window drawn: the tokens that step may attend to (s5: up to word n + k).
    Bottom: the waveform of the whole utterance."""
    import numpy as np

    plt = _pyplot()
    steps = units[0].attention_trace if units else []
    if not steps:
        raise ValueError("no attention was traced (SynthesisConfig.trace_attention)")
    tokens = max(len(s.attention) for s in steps)
    grid = np.zeros((tokens, len(steps)), np.float32)
    for i, step in enumerate(steps):
        grid[: len(step.attention), i] = step.attention
    word_of_token = max((s.word_of_token for s in steps), key=len)
    words = units[0].words
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), dpi=110, height_ratios=[2, 1])
    top.imshow(grid, aspect="auto", origin="lower", cmap="magma", interpolation="nearest")
    seen = [int((word_of_token <= s.visible_words).sum()) - 0.5 for s in steps]
    current = [(np.nonzero(word_of_token == s.word)[0].mean() if (word_of_token == s.word).any() else np.nan) for s in steps]
    top.step(range(len(steps)), seen, where="mid", color="#4dd0e1", linewidth=1.5, label="lookahead window: the tokens a step may attend to")
    top.plot(range(len(steps)), current, color="white", linewidth=1, linestyle=":", label="word being spoken")
    starts = [int(np.argmax(word_of_token == w)) for w in range(1, len(words) + 1) if (word_of_token == w).any()]
    top.set_yticks(starts, [words[i] for i in range(len(starts))], fontsize=7)
    top.set_xlabel("decoder step (codec frame)")
    k = "full context" if lookahead_words is None else f"k = {lookahead_words}"
    extra = f", first of {len(units)} synthesis units" if len(units) > 1 else ""
    top.set_title(f"cross-attention over the text ({k}{extra})", fontsize=10)
    top.legend(loc="upper left", fontsize=8)
    t = np.arange(len(audio)) / sample_rate
    bottom.plot(t, audio, linewidth=0.4, color="#1b9e77")
    bottom.set_xlim(0, max(t[-1] if len(t) else 1.0, 1e-3))
    bottom.set_xlabel("seconds")
    bottom.set_title("the waveform (the whole utterance)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
