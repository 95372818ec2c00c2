"""Training: the checkpointed loop, FSDP, processes and devices, fine-tuning, the soak test."""
