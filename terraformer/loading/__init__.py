"""Loading: the config's vocabulary, and a trained checkpoint as a model."""
