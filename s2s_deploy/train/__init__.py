"""Training and evaluation: the trainer, BLEU and exact-match metrics, export evaluation."""
