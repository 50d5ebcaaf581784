"""Token streams: Ollama (official client), the embedded local model, replay scripts."""
