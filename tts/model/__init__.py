"""The S5-TTS network: config, layers, masks, alignment, losses, the model, incremental decoding, sampling.

Imports nothing else of `tts`."""
