"""The agent's settings (`configs/agent.yaml`) as typed dataclasses: one place for every default, unknown keys
refused with the key named, values checked where a wrong one would surface much later."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from llm.ollama_backend import DEFAULT_HOST, DEFAULT_MODEL
from llm.openai_backend import DEFAULT_URL
from tts.inference.streaming import DEFAULT_MAX_STRETCH, MODES, check_max_stretch
from tts.inference.synthesis import SynthesisConfig
from tts.paths import CONFIGS
from tts.typed_yaml import ConfigError, build, read_yaml

DEFAULT_AGENT_CONFIG = CONFIGS / "agent.yaml"
HISTORY_TURNS = 8  # user/assistant pairs kept in the prompt
SYSTEM_PROMPT = ("You are a friendly voice assistant. Answer in one to three short spoken sentences, "
                 "without lists, tables or code unless asked.")


LLM_BACKENDS = ("auto", "ollama", "openai", "embedded")


@dataclass
class LLMSettings:
    backend: str = "auto"  # auto: Ollama if reachable with the model pulled, else the embedded Gemma 3 270M; openai:
    # an OpenAI-compatible server (vLLM, TGI, llama.cpp's server, LM Studio, a hosted API) at `openai_url`
    ollama_host: str | None = None  # under $OLLAMA_HOST, over http://localhost:11434 (see `host`)
    ollama_model: str = DEFAULT_MODEL
    keep_alive: str = "30m"  # how long Ollama keeps the model loaded after a turn
    openai_url: str | None = None  # under $OPENAI_BASE_URL, over http://localhost:8000/v1 (see `url`)
    openai_model: str | None = None  # the name the OpenAI-compatible server knows the model by
    max_tokens: int | None = None  # openai: the most tokens a reply may take (None: the server's limit)

    @property
    def host(self) -> str:
        """Settings are honoured in one order: a command-line flag (the caller's), the environment, the config
        file, the shipped default. The shipped `configs/agent.yaml` names a host too, so the environment must
        come before the file or `OLLAMA_HOST` would never be read."""
        return os.environ.get("OLLAMA_HOST") or self.ollama_host or DEFAULT_HOST

    @property
    def url(self) -> str:
        """The OpenAI-compatible server, in the same order (`OPENAI_BASE_URL` is the official client's own)."""
        return os.environ.get("OPENAI_BASE_URL") or self.openai_url or DEFAULT_URL


@dataclass
class TTSSettings:
    mode: str = "s5"  # s5 | t5 | sentence
    emit_every: int | None = None  # t5 / sentence: decoder steps per chunk (None: 0.35 s, the paper's 30 at 86 frames/s)
    top_k: int = SynthesisConfig.top_k
    temperature: float = SynthesisConfig.temperature
    max_stretch: float = DEFAULT_MAX_STRETCH  # s5 pacing: speak up to this much slower while the LLM lags; 1 = off
    cfg_scale: float = SynthesisConfig.cfg_scale  # classifier-free guidance (models trained with cfg_dropout); 1 = off
    vocoder: str | None = None  # None: the codec's ("auto": `tts/codec/vocoder.py` choose_vocoder); "universal", "fast" or a folder

    def synthesis(self) -> SynthesisConfig:
        return SynthesisConfig(top_k=self.top_k, temperature=self.temperature, cfg_scale=self.cfg_scale)


@dataclass
class AudioSettings:
    output: str = "auto"  # auto | device | wav | null (auto falls back to WAV without a sound card)
    device: str | int | None = None
    voice: bool = False  # listen to the microphone too (Silero VAD + Whisper tiny.en); typing still works
    input_device: str | int | None = None
    end_silence_ms: float = 600.0  # a pause this long ends what the user says
    barge_in: bool = True  # speaking over the agent interrupts it (louder than its echo); false: half-duplex
    echo_coupling_db: float = 0.0  # how loud the loudspeaker reaches the microphone vs. the played signal (0: worst case)
    echo_margin_db: float = 6.0  # how much louder than that echo the user must be to interrupt


@dataclass
class AgentSettings:
    llm: LLMSettings = field(default_factory=LLMSettings)
    tts: TTSSettings = field(default_factory=TTSSettings)
    audio: AudioSettings = field(default_factory=AudioSettings)
    history_turns: int = HISTORY_TURNS
    system_prompt: str = SYSTEM_PROMPT

    def check(self, where: str = "agent config") -> AgentSettings:
        if self.tts.mode not in MODES:
            raise ConfigError(f"{where}: tts.mode {self.tts.mode!r} is not one of {', '.join(MODES)}")
        check_max_stretch(self.tts.max_stretch, f"{where}: tts.max_stretch")
        if self.llm.backend not in LLM_BACKENDS:
            raise ConfigError(f"{where}: llm.backend {self.llm.backend!r} is not one of {', '.join(LLM_BACKENDS)}")
        if self.audio.output not in ("auto", "device", "wav", "null"):
            raise ConfigError(f"{where}: audio.output {self.audio.output!r} is not one of auto, device, wav, null")
        if self.history_turns < 0 or self.tts.top_k < 1 or self.tts.temperature <= 0 or self.tts.cfg_scale <= 0:
            raise ConfigError(f"{where}: history_turns >= 0, tts.top_k >= 1, tts.temperature > 0 and tts.cfg_scale > 0, please")
        return self


def load_agent_settings(path: Path | None = None) -> AgentSettings:
    """`configs/agent.yaml` (or `path`) -> checked settings; a missing key takes the default above."""
    path = Path(path) if path else DEFAULT_AGENT_CONFIG
    if not path.exists():
        raise ConfigError(f"no agent config at {path}")
    return build(AgentSettings, read_yaml(path) or {}, str(path)).check(str(path))
