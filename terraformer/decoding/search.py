"""Autoregressive decoding of predict-mode models: greedy, sampling, beam.

The model contract (see `terraformer.models`): a Trax layer built with
`mode='predict'` and holding trained weights, called once per generated
token.

  * Encoder-decoder (`model.n_in == 2`): `(inputs [B, L], prev [B, 1]) ->
    (logits [B, 1, V], ...)`; the first `prev` is 0 (predict-mode
    `ShiftRight` is the identity), the first call also runs the encoder.
  * Decoder-only LM (`model.n_in == 1`): `prev [B, 1] -> logits [B, 1, V]`,
    first `prev` 0. A prompt is fed token by token (teacher-forced) before
    generation starts; rows of a batch may have prompts of different lengths.

`decode` is the one entry point:

  decode(model, inputs, max_length, method='greedy'|'sample'|'beam',
         temperature, top_k, top_p, beam_size, length_penalty, eos_id, seed)
    -> np.ndarray [B, T] int32

Each output row holds the generated tokens (the LM prompt excluded), up to and
including the first `eos_id`, then `pad_id`; `T <= max_length` is the longest
row. `decode_batches` decodes a list of inputs in padded batches with a tqdm
progress bar and returns token lists without EOS.

Sampling (`method='sample'`) draws the next token from `softmax(logits / T)`,
restricted to the `top_k` most probable tokens and then to the nucleus (the
smallest set of most probable tokens whose probability, after temperature and
top-k, sums to at least `top_p`). `temperature=0` is greedy. The paper (§4.4,
appendix 6.6) decodes arXiv abstracts "using greedy algorithm with temperature
T = 0.5": one left-to-right pass without beam search, each token drawn from
Trax's `logsoftmax_sample(log_probs, temperature=0.5)`, i.e. sampling from
`softmax(logits / 0.5)` (probabilities squared, renormalized). That is
`method='sample', temperature=0.5` here (`PAPER_SETTINGS`).

Each decoding step is ONE call of a jitted function `step_fn(x, weights,
state, rng) -> (outputs, new_state)`: by default `decode_step.make_step`,
`jax.jit(model.pure_fn)` with the state donated, so caches update in place
(see `default_step_fn`); pass another `step_fn` with the same signature to
`decode` to swap it. Token selection runs on
the host in numpy, seeded by `seed`.
"""
import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from trax.layers import attention
import tqdm

from terraformer.decoding import step as decode_step
from terraformer import errors

METHODS = ('greedy', 'sample', 'beam')
# The paper's decoding of arXiv abstracts (appendix 6.6): temperature 0.5.
PAPER_SETTINGS = {'method': 'sample', 'temperature': 0.5}
# Show a per-token progress bar when decoding at least this many steps.
_PROGRESS_MIN_STEPS = 64


def default_step_fn(model):
  """The jitted, state-donating per-token call of `model` (make_step).

  `step_fn(x, weights, state, rng) -> (outputs, new_state)`; the state
  passed in is consumed. Cached on the model, so repeated `decode` calls
  reuse the compiled steps.
  """
  fn = getattr(model, '_terraformer_step_fn', None)
  if fn is None:
    fn = decode_step.make_step(model, donate_state=True)
    model._terraformer_step_fn = fn  # pylint: disable=protected-access
  return fn


is_encoder_decoder = decode_step.is_encoder_decoder


def model_max_length(model):
  """The smallest `max_len` of the model's `tl.PositionalEncoding` layers.

  Positions beyond it are not represented (Trax clamps them silently), so it
  bounds encoder inputs and decoded lengths. None if the model has none.
  """
  limits = []

  def walk(layer):
    if isinstance(layer, attention.PositionalEncoding):
      limits.append(layer._max_len)  # pylint: disable=protected-access
    for sub in layer.sublayers:
      walk(sub)

  walk(model)
  return min(limits) if limits else None


def _signature(model, batch, input_length):
  return decode_step.predict_signature(model, input_length, batch)


def initial_state(model, signature):
  """Fresh predict-mode state (empty caches) of `model` for `signature`.

  Runs `model.init` under `jax.jit` and keeps only the state, so XLA drops the
  random weight initialization; the model's weights, state and rng are left
  as they were.
  """
  cache = model.__dict__.setdefault('_terraformer_init_fns', {})
  key = str(signature)
  if key not in cache:
    cache[key] = jax.jit(lambda r: model.init(signature, rng=r)[1])
  with _preserved(model):
    return cache[key](model.rng)


def weights_signature(model, signature):
  """The weights tree of `model` with `jax.ShapeDtypeStruct` leaves.

  Nothing is allocated, and the model (initialized or not) is unchanged.
  """
  with _preserved(model):
    return jax.eval_shape(lambda: model.init(signature)[0])


@contextlib.contextmanager
def _preserved(model):
  """Restores the weights, state and rngs of `model`'s layers on exit.

  Works on uninitialized models too (whose Trax setters would reject their
  own empty values), by saving each layer's private attributes.
  """
  saved = []

  def walk(layer):
    saved.append((layer, dict(
        (k, layer.__dict__[k]) for k in
        ('_weights', '_state', '_rng', '_init_cached') if k in layer.__dict__)))
    for sub in layer.sublayers:
      walk(sub)

  walk(model)
  try:
    yield
  finally:
    for layer, attrs in saved:
      layer.__dict__.update(attrs)


def _state_shapes(model, signature, n_steps):
  """Leaf shapes of the state after `n_steps` steps from a fresh state."""
  def run():
    weights, state = model.init(signature, rng=rng)
    for _ in range(n_steps):
      x = tuple(jnp.zeros(s.shape, s.dtype) for s in signature) if isinstance(
          signature, tuple) else jnp.zeros(signature.shape, signature.dtype)
      _, state = model.pure_fn(x, weights, state, rng)
    return state

  rng = model.rng
  with _preserved(model):
    return jax.eval_shape(run)


class _BatchLeaves:
  """Which state leaves hold rows of the batch (to reorder beams).

  A leaf is batch-major when its leading size is `batch * c` at batch size
  `batch` and `2 * batch * c` at twice that (e.g. attention caches of shape
  [batch * heads, length, d]); scalars such as cache indices are not. The
  state's structure can change after the first step (`tl.Cache` fills in), so
  each structure is matched with the shapes after 0, 1, 2, ... steps.
  """

  def __init__(self, model, make_signature, batch):
    self._model, self._make_signature, self._batch = (
        model, make_signature, batch)
    self._rows = {}  # treedef -> rows per example of each leaf (0: none).

  def rows(self, state):
    tree = jax.tree_util.tree_structure(state)
    for n_steps in range(4):
      if tree in self._rows:
        break
      one = _state_shapes(self._model, self._make_signature(self._batch),
                          n_steps)
      if jax.tree_util.tree_structure(one) != tree:
        continue
      two = _state_shapes(self._model,
                          self._make_signature(2 * self._batch), n_steps)
      rows = []
      for a, b in zip(jax.tree_util.tree_leaves(one),
                      jax.tree_util.tree_leaves(two)):
        a, b = tuple(a.shape), tuple(b.shape)
        per = a[0] // self._batch if a and a[0] % self._batch == 0 else 0
        rows.append(per if per and b[0] == 2 * self._batch * per else 0)
      self._rows[tree] = tuple(rows)
    if tree not in self._rows:
      raise errors.TerraformerError(
          'beam search: cannot tell which state entries hold batch rows')
    return self._rows[tree]


@functools.partial(jax.jit, static_argnums=1)
def _reorder_state(state, leaf_rows, order):
  """Gathers rows `order` (a permutation source, len batch) of the state.

  `leaf_rows` (a tuple, see `_BatchLeaves`) tells which leaves hold rows.
  """
  leaves, tree = jax.tree_util.tree_flatten(state)
  out = []
  for leaf, per in zip(leaves, leaf_rows):
    if per:
      shape = leaf.shape
      grouped = jnp.reshape(leaf, (len(order), per) + shape[1:])
      leaf = jnp.reshape(jnp.take(grouped, order, axis=0), shape)
    out.append(leaf)
  return jax.tree_util.tree_unflatten(tree, out)


def pad_batch(sequences, length=None, pad_id=0):
  """Stacks 1-D int sequences into [B, length] int32, right-padded."""
  sequences = [np.asarray(s, np.int32).reshape(-1) for s in sequences]
  longest = max([len(s) for s in sequences] + [0])
  length = longest if length is None else length
  if longest > length:
    raise errors.TerraformerError(
        f'input of {longest} tokens is longer than {length}')
  out = np.full((len(sequences), length), pad_id, np.int32)
  for i, s in enumerate(sequences):
    out[i, :len(s)] = s
  return out


def _as_rows(inputs):
  """A [B, L] array or list of sequences -> (list of 1-D int32 arrays)."""
  if isinstance(inputs, np.ndarray) or hasattr(inputs, 'shape'):
    inputs = np.asarray(inputs)
    if inputs.ndim != 2:
      raise errors.TerraformerError(
          f'inputs must be [batch, length], got shape {inputs.shape}')
    return [row.astype(np.int32) for row in inputs]
  return [np.asarray(s, np.int32).reshape(-1) for s in inputs]


def _power_of_two_at_least(n, floor=8):
  return max(floor, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def _log_softmax(logits):
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def sampling_log_probs(logits, temperature=1.0, top_k=0, top_p=1.0):
  """Log-probabilities [..., V] that `method='sample'` draws tokens from.

  `softmax(logits / temperature)`, restricted to the `top_k` largest (0: all)
  and then to the nucleus of probability `top_p` (the smallest set of most
  probable tokens whose probability sums to >= top_p), renormalized; excluded
  tokens get -inf. Needs `temperature > 0`.
  """
  log_probs = _log_softmax(np.asarray(logits, np.float64) / temperature)
  vocab = log_probs.shape[-1]
  if top_k and top_k < vocab:
    kth = -np.partition(-log_probs, top_k - 1, axis=-1)[..., top_k - 1:top_k]
    # Ties at the k-th value: keep the first k in index order.
    rank = np.argsort(np.argsort(-log_probs, axis=-1, kind='stable'),
                      axis=-1, kind='stable')
    log_probs = np.where((log_probs >= kth) & (rank < top_k), log_probs,
                         -np.inf)
    log_probs = _log_softmax(log_probs)
  if top_p < 1.0:
    order = np.argsort(-log_probs, axis=-1, kind='stable')
    sorted_probs = np.exp(np.take_along_axis(log_probs, order, axis=-1))
    before = np.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = before < top_p  # The first token is always kept.
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    log_probs = _log_softmax(np.where(keep, log_probs, -np.inf))
  return log_probs


def repeated_ngram_tokens(tokens, n):
  """Tokens that would repeat an n-gram of `tokens` if appended next.

  fairseq's `--no-repeat-ngram-size` rule: the next token t is banned when
  `tokens[-(n-1):] + [t]` already occurs in `tokens`. n = 0 bans nothing;
  n = 1 bans every token already present.
  """
  tokens = [int(t) for t in tokens]
  if n < 1 or len(tokens) < n - 1:
    return set()
  if n == 1:
    return set(tokens)
  prefix = tokens[len(tokens) - (n - 1):]
  return {tokens[i + n - 1] for i in range(len(tokens) - n + 1)
          if tokens[i:i + n - 1] == prefix}


def _ban_repeats(log_probs, tokens, n):
  """log_probs [V] with the tokens that repeat an n-gram set to -inf."""
  banned = repeated_ngram_tokens(tokens, n)
  if not banned:
    return log_probs
  log_probs = log_probs.copy()
  log_probs[list(banned)] = -np.inf
  return log_probs


def _check_args(method, max_length, temperature, top_k, top_p, beam_size,
                length_penalty, no_repeat_ngram=0):
  if method not in METHODS:
    raise errors.TerraformerError(
        f'unknown decoding method {method!r}; expected one of {METHODS}')
  if not isinstance(max_length, (int, np.integer)) or max_length < 1:
    raise errors.TerraformerError(
        f'max_length must be a positive integer, got {max_length!r}')
  if temperature is None or temperature < 0:
    raise errors.TerraformerError(
        f'temperature must be >= 0, got {temperature!r}')
  if top_k is None or top_k < 0:
    raise errors.TerraformerError(f'top_k must be >= 0, got {top_k!r}')
  if top_p is None or not 0 < top_p <= 1:
    raise errors.TerraformerError(f'top_p must be in (0, 1], got {top_p!r}')
  if not isinstance(beam_size, (int, np.integer)) or beam_size < 1:
    raise errors.TerraformerError(
        f'beam_size must be a positive integer, got {beam_size!r}')
  if length_penalty < 0:
    raise errors.TerraformerError(
        f'length_penalty must be >= 0, got {length_penalty!r}')
  if method != 'sample' and (top_k or top_p < 1.0):
    raise errors.TerraformerError(
        f'top_k/top_p apply to method=sample, not method={method}')
  if (not isinstance(no_repeat_ngram, (int, np.integer)) or
      no_repeat_ngram < 0):
    raise errors.TerraformerError(
        f'no_repeat_ngram must be an integer >= 0, got {no_repeat_ngram!r}')


class _Runner:
  """Feeds a predict-mode model one token per row per step."""

  def __init__(self, model, encoder_inputs, batch, step_fn):
    self.model = model
    self.encoder_inputs = encoder_inputs  # [batch, L] or None (LM).
    self.step_fn = step_fn or default_step_fn(model)
    self.weights = jax.tree_util.tree_map(jnp.asarray, model.weights)
    self.rng = model.rng  # As `model(x)` does: the same rng every step.
    length = None if encoder_inputs is None else encoder_inputs.shape[1]
    self.make_signature = lambda b: _signature(model, b, length)
    self.state = initial_state(model, self.make_signature(batch))

  def __call__(self, prev_tokens):
    """prev_tokens [batch] -> log-probs [batch, V] (float64, numpy)."""
    prev = jnp.asarray(np.asarray(prev_tokens, np.int32)[:, None])
    x = prev if self.encoder_inputs is None else (self.encoder_inputs, prev)
    outputs, self.state = self.step_fn(x, self.weights, self.state, self.rng)
    logits = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    return _log_softmax(np.asarray(logits)[:, -1, :])


def _progress_bar(total, progress):
  show = progress if progress is not None else total >= _PROGRESS_MIN_STEPS
  return tqdm.tqdm(total=total, desc='decoding', unit='tok', disable=not show,
                   leave=False)


def _prepare(model, inputs, batch_size, max_length, input_length, pad_id):
  """Returns (encoder inputs [B, L] or None, LM prompts (list), batch)."""
  limit = model_max_length(model)
  if is_encoder_decoder(model):
    if inputs is None:
      raise errors.TerraformerError('an encoder-decoder model needs inputs')
    rows = _as_rows(inputs)
    if not rows:
      raise errors.TerraformerError('no inputs to decode')
    longest = max(len(r) for r in rows)
    if input_length is None:
      input_length = _power_of_two_at_least(longest)
      if limit:
        input_length = min(input_length, max(limit, longest))
    if limit and longest > limit:
      raise errors.TerraformerError(
          f'input of {longest} tokens is longer than the model\'s maximum '
          f'length {limit}')
    if limit and max_length > limit:
      raise errors.TerraformerError(
          f'max_length={max_length} exceeds the model\'s maximum length '
          f'{limit}')
    encoder_inputs = jnp.asarray(pad_batch(rows, input_length, pad_id))
    return encoder_inputs, [np.zeros(0, np.int32)] * len(rows), len(rows)
  if inputs is None:
    prompts = [np.zeros(0, np.int32)] * (batch_size or 1)
  else:
    prompts = _as_rows(inputs)
    if not prompts:
      raise errors.TerraformerError('no inputs to decode')
  longest = max(len(p) for p in prompts)
  if limit and longest + max_length > limit:
    raise errors.TerraformerError(
        f'prompt ({longest} tokens) + max_length ({max_length}) exceeds the '
        f'model\'s maximum length {limit}')
  return None, prompts, len(prompts)


def decode(model, inputs=None, max_length=100, method='greedy',
           temperature=1.0, top_k=0, top_p=1.0, beam_size=4,
           length_penalty=0.0, eos_id=1, pad_id=0, seed=0, batch_size=None,
           input_length=None, progress=None, step_fn=None,
           return_scores=False, no_repeat_ngram=0):
  """Decodes a batch autoregressively with a predict-mode model.

  Args:
    model: Trax layer in predict mode with weights (see the module docstring
      for the contract); its own state is not used or changed.
    inputs: encoder inputs (encoder-decoder) or prompts (LM): a list of 1-D
      int sequences of any lengths, or a [B, L] int array. Encoder inputs
      are zero-padded to `input_length`; LM prompts are fed as they are
      (every row of an array is a whole prompt: use a list for prompts of
      different lengths). For an LM, None decodes `batch_size` rows from
      the start token alone.
    max_length: most tokens generated per row (EOS included).
    method: 'greedy' (argmax), 'sample' (see `sampling_log_probs`) or
      'beam' (beam search).
    temperature: for 'sample'; 0 is greedy. The paper's "greedy with T=0.5"
      is `method='sample', temperature=0.5`.
    top_k: for 'sample': keep only the k most probable tokens (0: all).
    top_p: for 'sample': nucleus probability (1.0: all).
    beam_size: beams per row for 'beam'.
    length_penalty: for 'beam', alpha in the GNMT score
      `log_prob / ((5 + length) / 6) ** alpha`; 0 ranks by log-probability.
    eos_id: end-of-sequence id (a row stops after it); None: never stop early.
    pad_id: fills rows after their EOS.
    seed: seed of the sampling noise (numpy), for 'sample'.
    batch_size: number of rows for an LM without `inputs`.
    input_length: pad encoder inputs to this length; default: the next power
      of two >= the longest input (at least 8; capped at the model's maximum).
    progress: show a tqdm bar per token; None: only for >= 64 steps.
    step_fn: jitted `(x, weights, state, rng) -> (outputs, state)`; default
      `default_step_fn(model)`.
    return_scores: also return per-row log-probabilities of the output (the
      beam score, length penalty included, for 'beam').
    no_repeat_ngram: n > 0: a row never repeats one of its own token
      n-grams (`repeated_ngram_tokens`; the LM prompt excluded), for every
      method: the banned tokens get probability 0 before the choice.
      Trax's decoding has no such rule; 0 (the default) decodes as Trax.

  Returns:
    int32 array [B, T]; with `return_scores`, (array, float64 scores [B]).
  """
  _check_args(method, max_length, temperature, top_k, top_p, beam_size,
              length_penalty, no_repeat_ngram)
  encoder_inputs, prompts, batch = _prepare(model, inputs, batch_size,
                                            max_length, input_length, pad_id)
  if method == 'beam':
    tokens, scores = _beam_search(model, encoder_inputs, prompts, batch,
                                  max_length, beam_size, length_penalty,
                                  eos_id, pad_id, progress, step_fn,
                                  no_repeat_ngram)
  else:
    temperature = temperature if method == 'sample' else 0.0
    tokens, scores = _sample(model, encoder_inputs, prompts, batch,
                             max_length, temperature, top_k, top_p, eos_id,
                             pad_id, seed, progress, step_fn, no_repeat_ngram)
  return (tokens, scores) if return_scores else tokens


def _sample(model, encoder_inputs, prompts, batch, max_length, temperature,
            top_k, top_p, eos_id, pad_id, seed, progress, step_fn,
            no_repeat_ngram=0):
  """Greedy (temperature 0) or sampled decoding; returns (tokens, scores)."""
  run = _Runner(model, encoder_inputs, batch, step_fn)
  rng = np.random.default_rng(seed)
  prompt_len = np.array([len(p) for p in prompts])
  total = int(prompt_len.max()) + max_length
  out = np.full((batch, max_length), pad_id, np.int32)
  scores = np.zeros(batch)
  n_out = np.zeros(batch, np.int64)
  done = np.zeros(batch, bool)
  prev = np.zeros(batch, np.int32)
  with _progress_bar(total, progress) as bar:
    for t in range(total):
      log_probs = run(prev)
      bar.update(1)
      allowed = log_probs
      if no_repeat_ngram:
        allowed = np.stack([
            _ban_repeats(log_probs[b], out[b, :n_out[b]], no_repeat_ngram)
            for b in range(batch)])
      if temperature > 0:
        probs = sampling_log_probs(allowed, temperature, top_k, top_p)
        gumbel = -np.log(-np.log(rng.uniform(1e-12, 1.0, probs.shape)))
        chosen = np.argmax(probs + gumbel, axis=-1)
      else:
        chosen = np.argmax(allowed, axis=-1)
      prev = np.zeros(batch, np.int32)
      for b in range(batch):
        if t < prompt_len[b]:
          prev[b] = prompts[b][t]
        elif not done[b]:
          token = int(chosen[b])
          out[b, n_out[b]] = token
          scores[b] += log_probs[b, token]
          n_out[b] += 1
          done[b] = n_out[b] >= max_length or token == eos_id
          prev[b] = token
      if done.all():
        break
  return out[:, :max(1, int(n_out.max()))], scores


def _length_penalty(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


def _beam_search(model, encoder_inputs, prompts, batch, max_length, beam_size,
                 alpha, eos_id, pad_id, progress, step_fn, no_repeat_ngram=0):
  """Beam search; returns (best tokens [B, T], their scores [B]).

  Each row keeps `beam_size` alive hypotheses (no EOS yet) and the
  `beam_size` best finished ones (ended by EOS, or by `max_length`), scored
  `log_prob / ((5 + length) / 6) ** alpha`. A row stops once its worst
  finished hypothesis scores at least the best any alive one could reach.
  """
  k = beam_size
  n = batch * k
  if encoder_inputs is not None:
    encoder_inputs = jnp.repeat(encoder_inputs, k, axis=0)
  run = _Runner(model, encoder_inputs, n, step_fn)
  leaves = None
  if k > 1:  # Cached on the model: the shapes are traced once per signature.
    cache = model.__dict__.setdefault('_terraformer_batch_leaves', {})
    key = str(run.make_signature(n))
    leaves = cache.setdefault(
        key, _BatchLeaves(model, run.make_signature, n))
  prompt_len = np.array([len(p) for p in prompts])
  total = int(prompt_len.max()) + max_length
  alive = np.full((batch, k, max_length), pad_id, np.int32)
  alive_lp = np.full((batch, k), -np.inf)
  alive_lp[:, 0] = 0.0  # Beams start identical: keep one.
  finished = [[] for _ in range(batch)]  # (score, tokens) lists.
  done = np.zeros(batch, bool)
  prev = np.zeros(n, np.int32)
  with _progress_bar(total, progress) as bar:
    for t in range(total):
      log_probs = run(prev).reshape(batch, k, -1)
      bar.update(1)
      vocab = log_probs.shape[-1]
      prev = prev.reshape(batch, k).copy()
      parents = np.tile(np.arange(k), (batch, 1))
      for b in range(batch):
        g = t - prompt_len[b]  # Index of the token generated now.
        if g < 0:
          prev[b] = prompts[b][t]
          continue
        if done[b]:
          prev[b] = pad_id
          continue
        step_lp = log_probs[b]
        if no_repeat_ngram:
          step_lp = np.stack([
              _ban_repeats(step_lp[j], alive[b, j, :g], no_repeat_ngram)
              for j in range(k)])
        cand = (alive_lp[b][:, None] + step_lp).reshape(-1)
        top = np.argsort(-cand, kind='stable')[:2 * k]
        new_alive, new_lp, new_parents, new_tokens = [], [], [], []
        for idx in top:
          beam, token, lp = idx // vocab, int(idx % vocab), cand[idx]
          if not np.isfinite(lp):
            continue
          seq = np.append(alive[b, beam, :g], token)
          if token == eos_id or g + 1 == max_length:
            finished[b].append((lp / _length_penalty(g + 1, alpha), seq))
          elif len(new_alive) < k:
            new_alive.append(seq)
            new_lp.append(lp)
            new_parents.append(beam)
            new_tokens.append(token)
        finished[b] = sorted(finished[b], key=lambda f: -f[0])[:k]
        for j in range(k):
          if j < len(new_alive):
            alive[b, j, :g + 1] = new_alive[j]
            alive_lp[b, j] = new_lp[j]
            parents[b, j], prev[b, j] = new_parents[j], new_tokens[j]
          else:
            alive_lp[b, j] = -np.inf
            parents[b, j], prev[b, j] = 0, pad_id
        best_alive = alive_lp[b].max()
        bound = best_alive / _length_penalty(max_length, alpha)
        done[b] = (g + 1 >= max_length or not np.isfinite(best_alive) or
                   (len(finished[b]) == k and finished[b][-1][0] >= bound))
      prev = prev.reshape(-1)
      if done.all():
        break
      if k > 1:
        order = (np.arange(batch)[:, None] * k + parents).reshape(-1)
        run.state = _reorder_state(run.state, leaves.rows(run.state),
                                   jnp.asarray(order))
  best = [f[0] if f else (0.0, np.zeros(0, np.int32)) for f in finished]
  length = max(1, max(len(seq) for _, seq in best))
  tokens = np.full((batch, length), pad_id, np.int32)
  for b, (_, seq) in enumerate(best):
    tokens[b, :len(seq)] = seq
  return tokens, np.array([score for score, _ in best])


def strip_eos(tokens, eos_id=1):
  """A row of `decode` -> list of ints before its first EOS.

  Rows of `decode` are padded only after an EOS (a row without EOS has all
  `max_length` tokens), so this also drops the padding.
  """
  row = [int(t) for t in np.asarray(tokens).reshape(-1)]
  if eos_id is not None and eos_id in row:
    row = row[:row.index(eos_id)]
  return row


def decode_batches(model, inputs, batch_size=8, progress=True, **kwargs):
  """Decodes a list of inputs (or LM prompts) in batches of `batch_size`.

  Encoder inputs are all padded to one length (`input_length`, default as in
  `decode` for the longest input), so results do not depend on the batching;
  the last batch is filled up with copies of its first input, which are
  dropped. Shows a tqdm bar over examples.

  Args:
    model: predict-mode model (see `decode`).
    inputs: list of 1-D int sequences.
    batch_size: rows per `decode` call.
    progress: show the progress bar over examples.
    **kwargs: passed to `decode` (max_length, method, temperature, ...).

  Returns:
    A list (one per input) of lists of ints, cut before the first EOS.
  """
  inputs = [np.asarray(x, np.int32).reshape(-1) for x in inputs]
  eos_id = kwargs.get('eos_id', 1)
  if is_encoder_decoder(model) and inputs and kwargs.get(
      'input_length') is None:
    # One padded length for all batches: results do not depend on batching.
    longest = max(len(x) for x in inputs)
    limit = model_max_length(model)
    kwargs['input_length'] = min(_power_of_two_at_least(longest),
                                 max(limit or 0, longest) or longest)
  results = []
  with tqdm.tqdm(total=len(inputs), desc='decoding', unit='ex',
                 disable=not progress) as bar:
    for start in range(0, len(inputs), batch_size):
      chunk = inputs[start:start + batch_size]
      padded = chunk + [chunk[0]] * (batch_size - len(chunk))
      tokens = decode(model, padded, progress=False, **kwargs)
      results += [strip_eos(row, eos_id) for row in tokens[:len(chunk)]]
      bar.update(len(chunk))
  return results
