"""Adapters for the frameworks voice developers build with: each translates its framework's events into the
transport-free core (`agent/text_speech.py`) and back. Each needs its extra: `s5-agent[wyoming]`, `s5-agent[pipecat]`."""
