"""Orchestrator: turn loop, word segmentation, text normalisation, latency records, CLI."""
