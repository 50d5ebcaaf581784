"""Measuring: Whisper/similarity/DNSMOS metrics, `s5 eval` through the streaming engine, the benchmarks."""
