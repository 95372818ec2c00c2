"""Evaluation: ROUGE on summaries, the OOD harness, TensorBoard exports."""
