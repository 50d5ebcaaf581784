"""`s5 distill`: interleaved multi-source distillation (IMSD, `docs/architecture.md` section 4) of a full-context T5-TTS
teacher into an S5-TTS student.

- D_audio: the paired corpus; the teacher's soft labels come from a teacher-forced pass over the same batch.
- D_text: text-only sentences the teacher speaks by sampling; a sample is kept only when the ASR (Whisper tiny.en)
  transcribes it with zero WER. Its frame-to-word alignment comes from the synthesizer itself (the words it completed).
- Loss = hidden_weight * MSE(final decoder hidden states) + kl_weight * KL(teacher || student) + CE (+ the
  student's alignment losses); one D_audio and one D_text mini-batch inside every gradient-accumulation cycle.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from audio_io.errors import UserError
from tts.data.tokens import TokenizedUtterance, load_tokenized
from tts.inference.export import load_exported
from tts.inference.synthesis import SynthesisConfig, TTSBundle, synthesize_text
from tts.model.losses import LossTerms, masked_mean
from tts.model.s5tts import S5TTS, teacher_forcing
from tts.paths import DEFAULT_TOKENS
from tts.training.trainer import TrainConfig, Trainer


def distill_schedule(**overrides) -> TrainConfig:
    """The trainer's settings for distillation: a pretrained student, so a short, gentle schedule with no alignment
    prior (the student's alignment is already learned)."""
    settings = dict(data=DEFAULT_TOKENS, out="runs/s5_distilled", grad_accum=2, lr=2e-4, lr_min=5e-5, warmup_steps=50,
                    max_steps=1000, prior_full_until=0, prior_zero_at=0, aux_warmup_steps=0)
    return TrainConfig(**(settings | overrides))


@dataclass
class DistillConfig:
    teacher: str = "tts/assets/models/t5_default"  # exported full-context model
    student: str = "tts/assets/models/s5_default"  # exported S5 model to start from (pretrained)
    text_limit: int = 200
    asr_filter: bool = True  # keep only zero-WER teacher samples
    hidden_weight: float = 10.0
    kl_weight: float = 1.0
    ce_weight: float = 1.0
    train: TrainConfig = field(default_factory=distill_schedule)  # data, out, schedule, threads


# ---- losses -----------------------------------------------------------------------------------------------------
def kl_teacher_student(teacher_logits: torch.Tensor, student_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per codebook, averaged over codebooks and masked positions. logits: (B, S, K, V)"""
    teacher_logp = teacher_logits.float().log_softmax(-1)
    student_logp = student_logits.float().log_softmax(-1)
    per_codebook = (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1)  # (B, S, K)
    return masked_mean(per_codebook, mask)


@dataclass
class DistillLosses(LossTerms):
    total: torch.Tensor
    ce: torch.Tensor
    kl: torch.Tensor
    hidden_mse: torch.Tensor
    alignment: torch.Tensor


def distill_losses(student: S5TTS, teacher: S5TTS, batch, config: DistillConfig) -> DistillLosses:
    out = student(batch)  # teacher-forced, with CE and the alignment losses
    with torch.no_grad():
        teacher_out = teacher(batch)
    _, _, valid = teacher_forcing(batch.codes, batch.code_lens, student.config.bos_id, student.config.eos_id)
    kl = kl_teacher_student(teacher_out.logits, out.logits, valid)
    hidden = masked_mean((out.hidden - teacher_out.hidden) ** 2, valid)
    alignment = out.losses.total - student.config.ce_weight * out.losses.ce
    total = config.ce_weight * out.losses.ce + config.kl_weight * kl + config.hidden_weight * hidden + alignment
    return DistillLosses(total, out.losses.ce, kl, hidden, alignment)


# ---- D_text -----------------------------------------------------------------------------------------------------
def teacher_text_set(teacher: TTSBundle, sentences: list[str], asr_filter: bool = True, seed: int = 0,
                     progress=None) -> tuple[list[TokenizedUtterance], dict]:
    """Teacher samples of text-only sentences; with asr_filter only those the ASR transcribes exactly."""
    if asr_filter:
        from tts.eval.metrics import error_rates, transcribe
    kept: list[TokenizedUtterance] = []
    task = progress.add_task("D_text (teacher)", total=len(sentences)) if progress else None
    for i, text in enumerate(sentences):
        codes, chunks = synthesize_text(teacher, text, SynthesisConfig(seed=seed + i))
        if progress:
            progress.advance(task)
        if not chunks or codes.shape[1] == 0:
            continue
        if asr_filter:
            hypothesis = transcribe(teacher.codec.decode(codes), teacher.codec.sample_rate)
            if error_rates([text], [hypothesis])[0] > 0:
                continue
        words = [teacher.g2p.encode_words([c.word])[0] for c in chunks]
        frame_words = np.concatenate([np.full(c.codes.shape[1], i + 1, dtype=np.int16) for i, c in enumerate(chunks)])
        kept.append(TokenizedUtterance(text, "teacher", words, codes.numpy().astype(np.int16), frame_words))
    stats = {"generated": len(sentences), "kept": len(kept), "kept_fraction": round(len(kept) / max(1, len(sentences)), 3)}
    return kept, stats


# ---- training ---------------------------------------------------------------------------------------------------
def distill(config: DistillConfig, sentences: list[str], progress=None) -> dict:
    teacher_model, symbols, teacher_meta = load_exported(Path(config.teacher))
    if teacher_model.config.lookahead_words is not None:
        raise UserError(f"the teacher in {config.teacher} is not full-context (lookahead_words must be null)")
    student_model, _, _ = load_exported(Path(config.student))
    if student_model.config.lookahead_words is None:
        raise UserError(f"the student in {config.student} is full-context; distillation needs an S5 model")
    if teacher_model.config.d_model != student_model.config.d_model:
        raise UserError("teacher and student need the same d_model (hidden-state MSE)")
    from tts.codec.load import load_codec

    teacher = TTSBundle(teacher_model, symbols, load_codec(teacher_meta.get("train", {}).get("codec_dir")))
    audio_set = load_tokenized(Path(config.train.data), "train")
    if config.train.speakers:
        audio_set = [u for u in audio_set if u.speaker in config.train.speakers]
    if not audio_set:
        raise UserError(f"no training utterances in {config.train.data}")
    text_set, text_stats = teacher_text_set(teacher, sentences[: config.text_limit], config.asr_filter,
                                            config.train.seed, progress)

    trainer = Trainer(student_model.config, config.train, progress)
    if trainer.step == 0:  # a fresh run starts from the pretrained student
        trainer.model.load_state_dict(student_model.state_dict())
    teacher_model.to(trainer.device).eval()
    # one D_audio and one D_text mini-batch in every accumulation cycle, each under the distillation loss
    trainer.fit({"audio": audio_set, "text": text_set},
                loss=lambda student, batch: distill_losses(student, teacher_model, batch, config))
    trainer.save()
    return {"steps": trainer.step, "d_text": text_stats, "d_audio": len(audio_set), "config": asdict(config)}
