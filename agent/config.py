"""The agent's settings as typed dataclasses: the one place every default is written (a command's own default, e.g.
`s5 serve`'s vocoder, sits in `agent/settings.py`'s `COMMAND_DEFAULTS`). Unknown keys are refused with the key named;
values are checked where a wrong one would surface much later. Which source sets a key (flag, environment, config
file, default) is `agent/settings.py`'s job."""
from __future__ import annotations

from dataclasses import dataclass, field

from llm.ollama_backend import DEFAULT_HOST, DEFAULT_MODEL
from llm.openai_backend import DEFAULT_URL
from tts.inference.streaming import DEFAULT_MAX_STRETCH, MODES, check_max_stretch
from tts.inference.synthesis import SynthesisConfig
from tts.paths import CONFIGS
from tts.typed_yaml import ConfigError

DEFAULT_AGENT_CONFIG = CONFIGS / "agent.yaml"
HISTORY_TURNS = 8  # user/assistant pairs kept in the prompt
SYSTEM_PROMPT = ("You are a friendly voice assistant. Answer in one to three short spoken sentences, "
                 "without lists, tables or code unless asked.")


LLM_BACKENDS = ("auto", "ollama", "openai", "embedded")


@dataclass
class LLMSettings:
    backend: str = "auto"  # auto: Ollama if reachable with the model pulled, else the embedded Gemma 3 270M; openai:
    # an OpenAI-compatible server (vLLM, TGI, llama.cpp's server, LM Studio, a hosted API) at `openai_url`
    ollama_host: str = DEFAULT_HOST  # $OLLAMA_HOST
    ollama_model: str = DEFAULT_MODEL  # the paper's setup (Llama 3.3 70B, Q4_K_M)
    keep_alive: str = "30m"  # how long Ollama keeps the model loaded after a turn
    openai_url: str = DEFAULT_URL  # $OPENAI_BASE_URL, the official client's own variable
    openai_model: str | None = None  # the name the OpenAI-compatible server knows the model by
    openai_api_key: str | None = None  # $OPENAI_API_KEY (better there than in a file)
    max_tokens: int | None = None  # openai: the most tokens a reply may take (None: the server's limit)


@dataclass
class TTSSettings:
    mode: str = "s5"  # s5 | t5 | sentence
    emit_every: int | None = None  # t5 / sentence: decoder steps per chunk (None: 0.35 s, the paper's 30 at 86 frames/s)
    top_k: int = SynthesisConfig.top_k
    temperature: float = SynthesisConfig.temperature
    max_stretch: float = DEFAULT_MAX_STRETCH  # s5 pacing: speak up to this much slower while the LLM lags; 1 = off
    cfg_scale: float = SynthesisConfig.cfg_scale  # classifier-free guidance (models trained with cfg_dropout); 1 = off
    vocoder: str = "auto"  # auto: timed on this machine (`tts/codec/vocoder_choice.py`); universal, fast or a folder

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



def check_settings(settings: AgentSettings, where: str = "agent config", extra_backends: tuple[str, ...] = ()) -> AgentSettings:
    """Values the types allow but the program does not: one line naming the key. `extra_backends`: what a
    command accepts beyond the chat's LLMs (replay: a script's answers; serve: none)."""
    from audio_io.errors import UserError

    if settings.tts.mode not in MODES:
        raise ConfigError(f"{where}: tts.mode {settings.tts.mode!r} is not one of {', '.join(MODES)}")
    try:
        check_max_stretch(settings.tts.max_stretch, f"{where}: tts.max_stretch")
    except UserError as error:
        raise ConfigError(str(error)) from None
    backends = LLM_BACKENDS + extra_backends
    if settings.llm.backend not in backends:
        raise ConfigError(f"{where}: llm.backend {settings.llm.backend!r} is not one of {', '.join(backends)}")
    if settings.audio.output not in ("auto", "device", "wav", "null"):
        raise ConfigError(f"{where}: audio.output {settings.audio.output!r} is not one of auto, device, wav, null")
    tts = settings.tts
    if settings.history_turns < 0 or tts.top_k < 1 or tts.temperature <= 0 or tts.cfg_scale <= 0:
        raise ConfigError(f"{where}: history_turns >= 0, tts.top_k >= 1, tts.temperature > 0 and tts.cfg_scale > 0, please")
    if tts.emit_every is not None and tts.emit_every < 1:
        raise ConfigError(f"{where}: tts.emit_every {tts.emit_every} must be at least 1 (or null)")
    return settings
