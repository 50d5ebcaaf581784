"""S5-TTS: streaming T5-TTS with lookahead-causal masks. Subpackages, bottom to top: model -> frontend, codec
-> inference -> data -> eval, training."""
