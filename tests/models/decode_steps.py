"""Token-by-token decoding, for the tests that compare it with evaluation.

A model in predict mode does not shift its targets: it is fed the
right-shifted targets one token per call, and must give the logits of the
evaluation forward pass. Encoder-decoder models get their `inputs` with
every call (they encode them on the first).
"""
import numpy as np
from trax import shapes


def decode_logits(predict_model, targets, inputs=None):
  """Logits [batch, length, vocab] of `predict_model`, one token per call."""
  shifted = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  steps = []
  for i in range(targets.shape[1]):
    token = shifted[:, i:i + 1]
    if inputs is None:
      steps.append(np.asarray(predict_model(token)))
    else:
      steps.append(np.asarray(predict_model((inputs, token))[0]))
  return np.concatenate(steps, axis=1)


def init_predict_model(build, weights, batch_size, inputs=None):
  """`build('predict')` with `weights`, for one token per call."""
  token = shapes.ShapeDtype((batch_size, 1), np.int32)
  model = build('predict')
  model.init(token if inputs is None else (shapes.signature(inputs), token))
  model.weights = weights
  return model


def eval_and_decode_logits(build, targets, inputs=None, rng=None):
  """(eval logits, decoded logits, eval model) of `build(mode)`.

  The eval model is initialized with `rng`; the predict model gets its
  weights.
  """
  batch = targets if inputs is None else (inputs, targets)
  eval_model = build('eval')
  eval_model.init(shapes.signature(batch), rng=rng)
  full = eval_model(batch)
  full = np.asarray(full if inputs is None else full[0])
  predict_model = init_predict_model(build, eval_model.weights,
                                     targets.shape[0], inputs)
  return full, decode_logits(predict_model, targets, inputs), eval_model
