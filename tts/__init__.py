"""S5-TTS: streaming T5-TTS with lookahead-causal masks."""
from .config import ModelConfig, load_model_config
from .incremental import DecoderState, IncrementalEncoder, decode_step
from .model import Batch, S5TTS
from .sampling import SamplingConfig, sample_codes

__all__ = [
    "Batch", "DecoderState", "IncrementalEncoder", "ModelConfig", "S5TTS", "SamplingConfig",
    "decode_step", "load_model_config", "sample_codes",
]
