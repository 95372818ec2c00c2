"""Training: the loop, FSDP, resuming, memory plan, fine-tuning, the soak test."""
