"""`s5 codec campaign`: the adversarial iSTFT vocoder trained over many CPU sessions, one command to start or resume.

A GAN vocoder needs far more steps than one session gives (HiFi-GAN and Vocos train for hundreds of thousands), and
its first thousands often sound worse than the regression start. So the run is a campaign:
- its recipe is a YAML file (`configs/vocoder_gan.yaml`), read into `CampaignConfig`;
- every `snapshot_minutes` the generator and the discriminators are written as fp16 safetensors into the committed
  folder (`checkpoint_dir`, in git), with the step; the optimizers' state stays in `run_dir` (not in git). A later
  session on a fresh clone resumes from the committed snapshot with fresh optimizers (and from `run_dir` when it is
  still there);
- every `eval_every_steps` a fixed validation set (the Piper voice speaking sentences no model here trained on,
  through the mel codec) is vocoded and judged: Distill-MOS first, DNSMOS second, Whisper WER for the words. Each
  judgement is a line of `progress.jsonl` in the committed folder, so the curve survives sessions; the best
  generator by Distill-MOS is kept beside the latest (`best/`, once one beats the starting weights).
The snapshots are committed once, when a session's work stops (each is 15-20 MB of fp16: one per session keeps the
history lean).
The corpus (recordings, the discriminators' "real") is built with the Piper voice when it is missing.

A machine where the judges cannot run (a rented GPU without Piper, Whisper or the MOS models) trains without them:
`train_unjudged` writes the generator every so often into a folder, and `judge_snapshots` scores those snapshots
where the judges are, into the same curve (each line names the run it came from).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from audio_io.errors import UserError
from tts.codec.istft_vocoder import IstftGenerator, IstftVocoderConfig
from tts.codec.mel_codec import MelCodec
from tts.codec.vocoder import Vocoder
from tts.typed_yaml import build, read_yaml
from tts.paths import repo_path
from tts.training.istft_vocoder_train import AdversarialLosses, IstftTrainConfig, train_istft_vocoder

PROGRESS = "progress.jsonl"
SNAPSHOT = "latest"
BEST = "best"


@dataclass
class CampaignConfig:
    corpus: str = "corpus"
    corpus_hours: float = 0.5  # built with the Piper voice alone when `corpus` has no train.jsonl
    run_dir: str = "runs/vocoder_gan"  # optimizer state and the training log: not committed
    checkpoint_dir: str = "training/vocoder_campaign"  # committed: latest/ and best/ weights, progress.jsonl
    codec: str = "tts/assets/mel_codec"
    validation_file: str = "configs/conversational_sentences.txt"  # selection; the bars are judged on other sets
    validation_sentences: int = 16
    eval_every_steps: int = 250
    snapshot_minutes: float = 8.0
    threads: int = 1
    # the rate halves every lr_half_life_steps campaign steps after lr_decay_from_step (None: constant), a function
    # of the step so that a campaign over many sessions follows one schedule
    lr_half_life_steps: float | None = None
    lr_decay_from_step: int = 0
    train: IstftTrainConfig = field(default_factory=IstftTrainConfig)
    model: IstftVocoderConfig = field(default_factory=IstftVocoderConfig)  # the generator's shape


def load_campaign_config(path: Path) -> CampaignConfig:
    """The YAML recipe, typed (`tts/typed_yaml.py`): an unknown key is refused with its name, numbers written as
    `1e-4` are numbers."""
    return build(CampaignConfig, read_yaml(path) or {}, str(path))


@dataclass
class ValidationSet:
    texts: list[str]
    log_mels: list[np.ndarray]  # the mel codec's decoded log-mel of the Piper voice speaking each text
    original: dict  # the Piper audio's own scores (the ceiling)

    @property
    def digest(self) -> str:
        """Names this set in the curve: scores on other speakings of the texts are not comparable."""
        import hashlib

        h = hashlib.sha1("\n".join(self.texts).encode())
        for m in self.log_mels:
            h.update(np.ascontiguousarray(m, dtype=np.float32).tobytes())
        return h.hexdigest()[:8]


def validation_set(config: CampaignConfig, codec: MelCodec, folder: Path) -> ValidationSet:
    """Spoken, coded and judged once, then kept in `folder` (the committed checkpoint_dir): Piper samples anew each
    time it speaks, so a set spoken again moves every score (one generator: 3.09 on one speaking, 3.01 on the
    next), and only one fixed set makes a curve over sessions."""
    from tts.cli import read_sentences
    from tts.codec import mel
    from tts.data.voices import SAMPLE_RATE, VOICES
    from tts.eval.metrics import distillmos, dnsmos, error_rates, transcribe

    cache = folder / "validation.npz"
    if cache.exists():
        data = np.load(cache, allow_pickle=False)
        n = int(data["n"])
        return ValidationSet([str(t) for t in data["texts"]], [data[f"mel{i}"] for i in range(n)],
                             json.loads(str(data["original"])))
    texts = read_sentences(repo_path(config.validation_file))[: config.validation_sentences]
    audio = [VOICES["piper_joe"].synthesize(t).audio for t in texts]
    mels = [codec.decode_features(codec.encode_features(mel.log_mel(a))) for a in audio]
    original = {"distillmos": round(float(np.mean([distillmos(a, SAMPLE_RATE) for a in audio])), 3),
                "dnsmos": round(float(np.mean([dnsmos(a, SAMPLE_RATE) for a in audio])), 3),
                "wer": round(error_rates(texts, [transcribe(a, SAMPLE_RATE) for a in audio])[0], 2)}
    folder.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(cache, n=len(texts), texts=np.array(texts), original=json.dumps(original),
             **{f"mel{i}": m for i, m in enumerate(mels)})
    return ValidationSet(texts, mels, original)


@torch.inference_mode()
def judge(generator: IstftGenerator, validation: ValidationSet) -> dict:
    """Distill-MOS, DNSMOS (means) and Whisper WER of the generator's audio of every validation log-mel."""
    from tts.codec import mel
    from tts.eval.metrics import distillmos, dnsmos, error_rates, transcribe

    was_training = generator.training
    generator.eval()
    device = next(generator.parameters()).device
    audio = [generator(torch.from_numpy(m).float().T[None].to(device))[0, 0].cpu().numpy() for m in validation.log_mels]
    generator.train(was_training)
    rate = mel.SAMPLE_RATE
    return {"distillmos": round(float(np.mean([distillmos(a, rate) for a in audio])), 3),
            "dnsmos": round(float(np.mean([dnsmos(a, rate) for a in audio])), 3),
            "wer": round(error_rates(validation.texts, [transcribe(a, rate) for a in audio])[0], 2)}


def _save_fp16(module: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().half().cpu().contiguous() for k, v in module.state_dict().items()}, path)


def _load_float(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(path).items()}


def read_progress(checkpoint_dir: Path) -> list[dict]:
    path = checkpoint_dir / PROGRESS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def committed_start(checkpoint_dir: Path) -> dict | None:
    """The committed snapshot to resume from: {"step", "generator", "discriminators"} (None: there is none)."""
    latest = checkpoint_dir / SNAPSHOT
    if not (latest / "vocoder.safetensors").exists():
        return None
    state = json.loads((latest / "state.json").read_text())
    discriminators = latest / "discriminators.safetensors"
    return {"step": int(state["step"]), "generator": _load_float(latest / "vocoder.safetensors"),
            "discriminators": _load_float(discriminators) if discriminators.exists() else None}


class Campaign:
    """The on_step hook of one session's training: validation and committed snapshots."""

    def __init__(self, config: CampaignConfig, validation: ValidationSet, log=print):
        self.config, self.validation, self.log = config, validation, log
        self.checkpoint_dir = repo_path(config.checkpoint_dir)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.best = max((p["distillmos"] for p in read_progress(self.checkpoint_dir)
                         if p.get("validation") == validation.digest), default=float("-inf"))
        self.last_snapshot = time.monotonic()
        self.started = time.monotonic()
        self.step, self.generator, self.discriminators = 0, None, None  # as of the last step

    def __call__(self, step: int, generator: IstftGenerator, adversarial: AdversarialLosses | None) -> None:
        self.step, self.generator = step, generator
        self.discriminators = adversarial.discriminators if adversarial is not None else None
        if step % self.config.eval_every_steps == 0:
            self.validate(step, generator)
        if time.monotonic() - self.last_snapshot > self.config.snapshot_minutes * 60:
            self.snapshot()

    def finish(self) -> None:
        """The session's end: its last weights judged (unless just judged) and snapshotted."""
        if self.generator is None:
            return
        if self.step % self.config.eval_every_steps:
            self.validate(self.step, self.generator)
        self.snapshot()

    def validate(self, step: int, generator: IstftGenerator, run: str | None = None) -> dict:
        """Judge, append to the curve, keep as best/ if it is; `run` names a run trained elsewhere (its steps
        count from its own start)."""
        scores = {"step": step, **judge(generator, self.validation),
                  "session_minutes": round((time.monotonic() - self.started) / 60, 1),
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "validation": self.validation.digest,
                  **({"run": run} if run else {})}
        with (self.checkpoint_dir / PROGRESS).open("a") as f:
            f.write(json.dumps(scores) + "\n")
        if scores["distillmos"] > self.best:
            self.best = scores["distillmos"]
            if step > 0:  # at step 0 the best is the vocoder the campaign started from, already in the repository
                Vocoder(generator).save(self.checkpoint_dir / BEST)
                (self.checkpoint_dir / BEST / "state.json").write_text(json.dumps(scores))
                generator.train()
        self.log(f"{run + ' ' if run else ''}step {step}: Distill-MOS {scores['distillmos']} DNSMOS {scores['dnsmos']} WER {scores['wer']} "
                 f"(best Distill-MOS {self.best})")
        return scores

    def snapshot(self) -> None:
        latest = self.checkpoint_dir / SNAPSHOT
        Vocoder(self.generator).save(latest)
        self.generator.train()
        if self.discriminators is not None:
            _save_fp16(self.discriminators, latest / "discriminators.safetensors")
        (latest / "state.json").write_text(json.dumps({"step": self.step, "config": asdict(self.config)}, indent=1))
        self.last_snapshot = time.monotonic()


def run_campaign(config: CampaignConfig, minutes: float, log=print) -> dict:
    """Build what is missing (corpus, validation set), resume (run_dir's train_state.pt, else the committed
    snapshot, else `train.init_from`), train for `minutes`, validate and snapshot at the end."""
    torch.set_num_threads(config.threads)
    corpus, codec = _prepare(config, log)
    run_dir, checkpoint_dir = repo_path(config.run_dir), repo_path(config.checkpoint_dir)
    validation = validation_set(config, codec, checkpoint_dir)
    log(f"validation: {len(validation.texts)} sentences, the Piper voice itself {validation.original}")
    start = None if (run_dir / "train_state.pt").exists() else committed_start(checkpoint_dir)
    campaign = Campaign(config, validation, log)
    if start is None and not (run_dir / "train_state.pt").exists() and not read_progress(checkpoint_dir):
        campaign.validate(0, Vocoder.load(config.train.init_from).generator)  # the curve's first point
    train_config = IstftTrainConfig(**{**asdict(config.train), "minutes": minutes})
    result = train_istft_vocoder(corpus, codec, run_dir, config.model, train_config, start=start,
                                 on_step=campaign, constant_lr=True, lr_scale=lambda step: lr_scale(config, step))
    campaign.finish()
    return result


def lr_scale(config: CampaignConfig, step: int) -> float:
    """The campaign's rate at `step`, as a fraction of `train.lr`."""
    if config.lr_half_life_steps is None:
        return 1.0
    return 0.5 ** (max(0, step - config.lr_decay_from_step) / config.lr_half_life_steps)


def _mel_codec(config: CampaignConfig) -> MelCodec:
    from tts.codec.load import load_codec

    codec = load_codec(config.codec)
    if not isinstance(codec, MelCodec):
        raise UserError(f"{config.codec} is not a mel codec")
    return codec


def _prepare(config: CampaignConfig, log) -> tuple[Path, MelCodec]:
    """The corpus (built with the Piper voice when missing) and the mel codec."""
    corpus = repo_path(config.corpus)
    if not (corpus / "train.jsonl").exists():
        from tts.data.corpus import CorpusConfig, build_corpus

        log(f"building a {config.corpus_hours} h Piper corpus in {corpus}")
        build_corpus(CorpusConfig(hours=config.corpus_hours, voices=["piper_joe"], held_out=[]), corpus)
    return corpus, _mel_codec(config)


def train_unjudged(config: CampaignConfig, minutes: float, out: Path, snapshots: int, log=print) -> dict:
    """Train from `train.init_from` for `minutes` on `train.device` with the learning rate on a cosine over the
    run, writing the generator `snapshots` times, evenly in time, into out/step_<N>/ (the last at the end), for
    `judge_snapshots`. Nothing is judged or committed here."""
    torch.set_num_threads(config.threads)
    corpus, codec = _prepare(config, log)
    every_s, started, written = minutes * 60 / snapshots, time.monotonic(), [0]
    last_log = [started]

    def on_step(step: int, generator: IstftGenerator, adversarial: AdversarialLosses | None) -> None:
        now = time.monotonic()
        if now - last_log[0] > 30:
            log(f"step {step} at {(now - started) / 60:.1f} min")
            last_log[0] = now
        if written[0] < snapshots - 1 and now - started >= every_s * (written[0] + 1):
            Vocoder(generator).save(out / f"step_{step}")
            generator.train()
            written[0] += 1

    train_config = IstftTrainConfig(**{**asdict(config.train), "minutes": minutes})
    result = train_istft_vocoder(corpus, codec, repo_path(config.run_dir), config.model, train_config,
                                 on_step=on_step)
    final = Vocoder.load(repo_path(config.run_dir))  # train_for_minutes saved its last weights there
    final.save(out / f"step_{result['steps']}")
    return result


def judge_snapshots(config: CampaignConfig, folders: list[Path], run: str, log=print) -> list[dict]:
    """Score each out/step_<N>/ of `train_unjudged` with the campaign's judges into its curve (best/ kept)."""
    import re

    torch.set_num_threads(config.threads)
    steps = [re.fullmatch(r"step_(\d+)", folder.name) for folder in folders]
    for folder, step in zip(folders, steps):  # all checked before the judges load
        if step is None or not (folder / "vocoder.safetensors").exists():
            raise UserError(f"{folder} is not a step_<N> vocoder snapshot")
    campaign = Campaign(config, validation_set(config, _mel_codec(config), repo_path(config.checkpoint_dir)), log)
    scores = []
    for folder, step in zip(folders, steps):
        generator = Vocoder.load(folder).generator
        if not isinstance(generator, IstftGenerator):
            raise UserError(f"{folder} is not an iSTFT vocoder")
        scores.append(campaign.validate(int(step.group(1)), generator, run))
    return scores
