"""Training: the S5/T5 trainer, IMSD distillation, codec and vocoder training."""
