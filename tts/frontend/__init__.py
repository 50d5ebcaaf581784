"""Text to model input: the normaliser (text -> speakable words) and G2P (words -> phoneme ids)."""
