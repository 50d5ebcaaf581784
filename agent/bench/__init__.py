"""Benchmarks of the whole agent: end to end (`s5 bench e2e`), voice to voice, and the server under load."""
