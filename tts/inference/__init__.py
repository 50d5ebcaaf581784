"""Speaking: release files, `TTSBundle`, the word-by-word synthesizer and the streaming engine.

Imports `tts.model`, `tts.frontend` and `tts.codec`, never training or evaluation code."""
