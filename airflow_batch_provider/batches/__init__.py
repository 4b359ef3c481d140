"""Stages 2 and 3, chunk → provider batch → finished batch: checkpoints, line retries, the token budget."""
