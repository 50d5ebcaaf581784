"""Playback (sounddevice), WAV and null sinks, crossfade."""
