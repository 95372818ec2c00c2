"""Greedy decoding of a small model through decode_step, for the kernel tests.

tests/kernels compare the fused-kernel step with the XLA step (and the cache
kernel with the bucketed cache) on the same greedy trajectory: this is the one
loop they share.
"""
import jax
import jax.numpy as jnp
import numpy as np

from terraformer.decoding import step as decode_step


def greedy(build, options, n_tokens=12, compiled=False):
  """(logits [n_tokens, vocab], tokens, HLO text of the next step).

  build: a function returning a model in 'predict' mode (an encoder-decoder
  gets the prompt 1..8 as its input). options: decode_step's (path, storage).
  compiled: the optimized HLO of the compiled step instead of the lowered one.
  """
  model = build()
  encdec = decode_step.is_encoder_decoder(model)
  sig = decode_step.predict_signature(model, prompt_len=8)
  weights, state = model.init(sig, rng=jax.random.PRNGKey(1))
  step = decode_step.make_step(model, options=options)
  inputs = jnp.arange(1, 9, dtype=jnp.int32)[None]
  token = jnp.full((1, 1), 5, jnp.int32)
  logits, tokens = [], []
  for _ in range(n_tokens):
    x = (inputs, token) if encdec else token
    outputs, state = step(x, weights, state, jax.random.PRNGKey(0))
    last = (outputs[0] if isinstance(outputs, (tuple, list)) else outputs)
    last = last[:, -1]
    token = jnp.argmax(last, -1).astype(jnp.int32)[:, None]
    logits.append(np.asarray(last[0]))
    tokens.append(int(token[0, 0]))
  x = (inputs, token) if encdec else token
  lowered = step.jitted.lower(x, step.store_weights(weights), state,
                              jax.random.PRNGKey(0))
  hlo = lowered.compile().as_text() if compiled else lowered.as_text()
  return np.stack(logits), tokens, hlo
