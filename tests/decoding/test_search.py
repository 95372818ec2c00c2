"""Decoding: sampling distributions, beam search, predict == eval, batching."""
import itertools

import jax
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes
from trax.supervised import decoding as trax_decoding

from terraformer.decoding import step as decode_step
from terraformer.decoding import search as decoding
from terraformer import errors
from terraformer.models import ScalingTransformer
from terraformer.models import ScalingTransformerLM

EOS = 1


# A Markov-chain "model": the logits of the next token are row `prev` of a
# fixed table, so every sampling distribution is known exactly.
def _markov_lm(table):
  table = np.asarray(table, np.float32)
  model = tl.Embedding(table.shape[0], table.shape[1])
  model.init(shapes.ShapeDtype((1, 1), np.int32))
  model.weights = table  # Embedding(prev) = table[prev] = logits.
  return model


def _markov_encdec(table):
  """(inputs, prev) -> (table[prev], prev): n_in = 2, ignores the inputs."""
  table = np.asarray(table, np.float32)
  model = tl.Serial(tl.Select([1, 1], n_in=2),
                    tl.Embedding(table.shape[0], table.shape[1]))
  model.init((shapes.ShapeDtype((1, 4), np.int32),
              shapes.ShapeDtype((1, 1), np.int32)))
  model.weights = ((), table)
  return model


def _softmax(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max())
  return e / e.sum()


V = 6
TABLE = np.random.RandomState(0).normal(size=(V, V)) * 1.5
N_SAMPLES = 20000


def _frequencies(tokens):
  return np.bincount(tokens, minlength=V) / len(tokens)


def _check_frequencies(tokens, expected):
  freq = _frequencies(tokens)
  tolerance = 5 * np.sqrt(expected * (1 - expected) / len(tokens)) + 1e-12
  assert np.all(np.abs(freq - expected) <= tolerance), (freq, expected)
  assert np.all(freq[expected == 0] == 0)


@pytest.mark.parametrize('temperature', [0.5, 1.0, 2.0])
def test_temperature_sampling_distribution(temperature):
  model = _markov_lm(TABLE)
  out = decoding.decode(model, None, batch_size=N_SAMPLES, max_length=1,
                        method='sample', temperature=temperature, eos_id=None,
                        seed=1)
  _check_frequencies(out[:, 0], _softmax(TABLE[0] / temperature))


def test_temperature_changes_the_distribution():
  # Guards the test above: T=0.5 and T=2 give distinguishable frequencies.
  model = _markov_lm(TABLE)
  freqs = [_frequencies(decoding.decode(
      model, None, batch_size=N_SAMPLES, max_length=1, method='sample',
      temperature=t, eos_id=None, seed=1)[:, 0]) for t in (0.5, 2.0)]
  assert np.abs(freqs[0] - freqs[1]).max() > 0.05


def test_sampling_conditions_on_the_prompt():
  # Prompt [4]: the first generated token follows row 4 of the table.
  model = _markov_lm(TABLE)
  out = decoding.decode(model, [[4]] * N_SAMPLES, max_length=1,
                        method='sample', temperature=1.0, eos_id=None, seed=2)
  _check_frequencies(out[:, 0], _softmax(TABLE[4]))


@pytest.mark.parametrize('top_k', [1, 2, 4])
def test_top_k_distribution(top_k):
  model = _markov_lm(TABLE)
  out = decoding.decode(model, None, batch_size=N_SAMPLES, max_length=1,
                        method='sample', temperature=0.8, top_k=top_k,
                        eos_id=None, seed=3)
  p = _softmax(TABLE[0] / 0.8)
  keep = np.argsort(-p)[:top_k]
  expected = np.zeros(V)
  expected[keep] = p[keep] / p[keep].sum()
  _check_frequencies(out[:, 0], expected)


@pytest.mark.parametrize('top_p', [0.3, 0.6, 0.9])
def test_top_p_distribution(top_p):
  model = _markov_lm(TABLE)
  out = decoding.decode(model, None, batch_size=N_SAMPLES, max_length=1,
                        method='sample', temperature=1.0, top_p=top_p,
                        eos_id=None, seed=4)
  p = _softmax(TABLE[0])
  order = np.argsort(-p)
  # Smallest prefix of the sorted tokens with probability >= top_p.
  n_keep = int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)
  keep = order[:n_keep]
  expected = np.zeros(V)
  expected[keep] = p[keep] / p[keep].sum()
  assert 0 < n_keep < V
  _check_frequencies(out[:, 0], expected)


def test_sampling_is_reproducible_with_a_seed():
  model = _markov_lm(TABLE)
  run = lambda seed: decoding.decode(
      model, None, batch_size=64, max_length=8, method='sample',
      temperature=1.0, eos_id=None, seed=seed)
  np.testing.assert_array_equal(run(5), run(5))
  assert not np.array_equal(run(5), run(6))


def test_greedy_and_zero_temperature_follow_the_argmax_chain():
  model = _markov_lm(TABLE)
  expected, prev = [], 0
  for _ in range(7):
    prev = int(np.argmax(TABLE[prev]))
    expected.append(prev)
  for kwargs in ({'method': 'greedy'},
                 {'method': 'sample', 'temperature': 0.0}):
    out = decoding.decode(model, None, max_length=7, eos_id=None, **kwargs)
    np.testing.assert_array_equal(out, [expected])


def _eos_chain():
  """0 -> 2 -> 3 -> EOS; 4 -> 5 -> 4 -> ... (never EOS). Deterministic."""
  table = np.full((V, V), -10.0)
  for a, b in [(0, 2), (2, 3), (3, EOS), (EOS, 0), (4, 5), (5, 4)]:
    table[a, b] = 10.0
  return table


def test_eos_stops_a_row_and_pads_it():
  model = _markov_lm(_eos_chain())
  out = decoding.decode(model, [[], [4]], max_length=6, eos_id=EOS)
  np.testing.assert_array_equal(out, [[2, 3, EOS, 0, 0, 0],
                                      [5, 4, 5, 4, 5, 4]])
  out = decoding.decode(model, [[]], max_length=6, eos_id=EOS)
  np.testing.assert_array_equal(out, [[2, 3, EOS]])  # Stops: shorter output.
  assert decoding.strip_eos(out[0]) == [2, 3]


def test_max_length_stops():
  model = _markov_lm(_eos_chain())
  out = decoding.decode(model, [[]], max_length=2, eos_id=EOS)
  np.testing.assert_array_equal(out, [[2, 3]])
  out = decoding.decode(model, [[]], max_length=3, eos_id=None)
  np.testing.assert_array_equal(out, [[2, 3, EOS]])


@pytest.mark.parametrize('tokens, n, banned', [
    ([7, 8, 7], 2, {8}),          # "7 8" seen: after 7, 8 would repeat it.
    ([7, 8, 7, 9, 7], 2, {8, 9}),
    ([7, 8, 9, 7, 8], 3, {9}),    # "7 8 9" seen: after "7 8", 9 repeats.
    ([7, 8, 9, 7, 9], 3, set()),  # "7 9" starts no trigram yet.
    ([7, 8], 1, {7, 8}),
    ([7, 8, 7], 0, set()),
    ([7], 3, set()),
])
def test_repeated_ngram_tokens(tokens, n, banned):
  assert decoding.repeated_ngram_tokens(tokens, n) == banned


def test_no_repeat_ngram_leaves_the_loop():
  # Greedy from prompt [4] loops 5 4 5 4 ...; with no repeated bigram, after
  # "5 4 5" the 4 is banned (the most probable of the rest is token 0), and
  # the chain 0 -> 2 -> 3 -> EOS follows.
  model = _markov_lm(_eos_chain())
  out = decoding.decode(model, [[4]], max_length=8, eos_id=EOS,
                        no_repeat_ngram=2)
  np.testing.assert_array_equal(out, [[5, 4, 5, 0, 2, 3, EOS]])
  out = decoding.decode(model, [[4]], max_length=8, eos_id=EOS)
  np.testing.assert_array_equal(out, [[5, 4, 5, 4, 5, 4, 5, 4]])



def _bigrams(row):
  return list(zip(row, row[1:]))


@pytest.mark.parametrize('method', ['greedy', 'beam'])
def test_no_repeated_bigram_in_a_long_output(method):
  model = _markov_lm(TABLE)  # Its argmax chain loops within 6 tokens.
  kwargs = dict(max_length=12, eos_id=None, method=method, beam_size=3)
  plain = decoding.decode(model, [[]], **kwargs)[0].tolist()
  assert len(set(_bigrams(plain))) < len(_bigrams(plain))
  out = decoding.decode(model, [[]], no_repeat_ngram=2, **kwargs)[0].tolist()
  assert len(out) == 12
  assert len(set(_bigrams(out))) == len(_bigrams(out))


def test_sampling_never_draws_a_banned_token():
  model = _markov_lm(np.zeros((V, V)))  # Uniform: every token is likely.
  out = decoding.decode(model, None, batch_size=200, max_length=V,
                        method='sample', eos_id=None, no_repeat_ngram=1)
  assert all(len(set(row)) == V for row in out.tolist())  # No token twice.
  plain = decoding.decode(model, None, batch_size=200, max_length=V,
                          method='sample', eos_id=None)
  assert any(len(set(row)) < V for row in plain.tolist())


def _beam_trap():
  """Greedy takes 2 (p .6) then EOS with p .2; beam finds 3 (p .4), EOS .99."""
  table = np.full((V, V), -30.0)
  table[0, :4] = np.log([1e-9, 1e-9, 0.6, 0.4])
  table[2, :] = np.log(0.8 / (V - 1))
  table[2, EOS] = np.log(0.2)
  table[3, :] = np.log(0.01 / (V - 1))
  table[3, EOS] = np.log(0.99)
  table[2, 0] = table[3, 0] = -30.0  # Keep away from the start token.
  return table


def test_beam_search_beats_greedy_on_a_trap():
  model = _markov_lm(_beam_trap())
  greedy, greedy_score = decoding.decode(model, [[]], max_length=4,
                                         eos_id=EOS, return_scores=True)
  beam, beam_score = decoding.decode(model, [[]], max_length=4, eos_id=EOS,
                                     method='beam', beam_size=2,
                                     return_scores=True)
  log_p = decoding._log_softmax(_beam_trap())  # pylint: disable=protected-access
  assert greedy[0, 0] == 2 and beam[0].tolist() == [3, EOS]
  np.testing.assert_allclose(beam_score,
                             [log_p[0, 3] + log_p[3, EOS]], rtol=1e-6)
  assert beam_score[0] > greedy_score[0] + 0.5


def test_beam_width_one_equals_greedy():
  for table in (TABLE, _beam_trap()):
    model = _markov_lm(table)
    prompts = [[], [3], [4, 2]]
    greedy = decoding.decode(model, prompts, max_length=6, eos_id=EOS)
    beam = decoding.decode(model, prompts, max_length=6, eos_id=EOS,
                           method='beam', beam_size=1)
    np.testing.assert_array_equal(beam, greedy)


def _sequence_log_prob(log_p, seq):
  prev, total = 0, 0.0
  for token in seq:
    total += log_p[prev, token]
    prev = token
  return total


@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_wide_beam_is_exhaustive_search(alpha):
  # With beam_size >= V ** (max_length - 1) no hypothesis is pruned: the
  # result is the best of all sequences (ended by EOS or by max_length).
  table = np.random.RandomState(7).normal(size=(4, 4)) * 2
  log_p = decoding._log_softmax(table)  # pylint: disable=protected-access
  max_length = 3
  best, best_seq = -np.inf, None
  for n in range(1, max_length + 1):
    for seq in itertools.product(range(4), repeat=n):
      if EOS in seq[:-1] or (n < max_length and seq[-1] != EOS):
        continue
      score = _sequence_log_prob(log_p, seq) / ((5 + n) / 6) ** alpha
      if score > best:
        best, best_seq = score, list(seq)
  model = _markov_lm(table)
  out, score = decoding.decode(model, None, max_length=max_length,
                               method='beam', beam_size=16, eos_id=EOS,
                               length_penalty=alpha, return_scores=True)
  assert out[0].tolist() == best_seq
  np.testing.assert_allclose(score, [best], rtol=1e-6)


def test_encoder_decoder_toy_contract():
  model = _markov_encdec(_eos_chain())
  out = decoding.decode(model, [[5, 6, 7], [8]], max_length=5, eos_id=EOS)
  np.testing.assert_array_equal(out, [[2, 3, EOS], [2, 3, EOS]])


def test_custom_step_fn_is_called_once_per_token():
  model = _markov_lm(_eos_chain())
  calls = []
  inner = decoding.default_step_fn(model)

  def step_fn(x, weights, state, rng):
    calls.append(np.asarray(x).copy())
    return inner(x, weights, state, rng)

  out = decoding.decode(model, [[4, 5]], max_length=3, eos_id=None,
                        step_fn=step_fn)
  assert out.tolist() == [[4, 5, 4]]
  # Start token, two prompt tokens, then two generated ones fed back.
  assert [int(c[0, 0]) for c in calls] == [0, 4, 5, 4, 5]


@pytest.mark.parametrize('kwargs, message', [
    (dict(method='nucleus'), 'unknown decoding method'),
    (dict(max_length=0), 'max_length'),
    (dict(method='sample', temperature=-1.0), 'temperature'),
    (dict(method='sample', top_p=0.0), 'top_p'),
    (dict(method='sample', top_k=-2), 'top_k'),
    (dict(method='beam', beam_size=0), 'beam_size'),
    (dict(method='greedy', top_k=3), 'top_k/top_p apply to method=sample'),
    (dict(no_repeat_ngram=-1), 'no_repeat_ngram'),
    (dict(max_length=100), 'maximum length'),
])
def test_bad_arguments(kwargs, message):
  model = _tiny_lm('dense', 'predict')
  model.init(shapes.ShapeDtype((1, 1), np.int32))
  with pytest.raises(errors.TerraformerError, match=message):
    decoding.decode(model, [[3, 4]], **{'max_length': 5, **kwargs})


# Real models: predict-mode decoding == re-running the eval-mode forward.
TINY = dict(d_model=32, d_ff=64, n_heads=4, dropout=0.0, max_len=32,
            d_lowrank=4)
VARIANTS = {
    'dense': {},
    'sparse_ff_qkv_loss': dict(ff_sparsity=8, attention_sparsity=4,
                               loss_sparsity=4),
}
VOCAB = 40


def _tiny_lm(variant, mode):
  return ScalingTransformerLM(vocab_size=VOCAB, n_layers=2, mode=mode,
                              **TINY, **VARIANTS[variant])


def _tiny_encdec(variant, mode):
  return ScalingTransformer(input_vocab_size=VOCAB, n_encoder_layers=1,
                            n_decoder_layers=2, mode=mode, **TINY,
                            **VARIANTS[variant])


def _trained_pair(make, variant, signature, seed):
  """(eval model, predict model) sharing random weights."""
  eval_model = make(variant, 'eval')
  eval_model.init(signature, rng=jax.random.PRNGKey(seed))
  predict_model = make(variant, 'predict')
  predict_sig = (tuple(shapes.ShapeDtype((1, s.shape[1]), s.dtype)
                       for s in signature[:1]) +
                 (shapes.ShapeDtype((1, 1), np.int32),)
                 if isinstance(signature, tuple)
                 else shapes.ShapeDtype((1, 1), np.int32))
  predict_model.init(predict_sig)
  predict_model.weights = eval_model.weights
  return eval_model, predict_model


ORACLE_LEN = 16  # Eval-mode oracles run on targets padded to this length.


def _eval_log_probs(eval_model, inputs, prefix):
  """Log-probs of the next token after `prefix` (1-D), by a full forward.

  The eval model is causal, so padding the targets after the prefix changes
  nothing; a fixed length lets one jitted forward serve every call.
  """
  forward = eval_model.__dict__.setdefault('_test_jit',
                                           jax.jit(eval_model.pure_fn))
  targets = np.zeros((1, ORACLE_LEN), np.int32)
  targets[0, :len(prefix)] = prefix
  x = targets if inputs is None else (
      np.asarray(inputs, np.int32)[None], targets)
  logits, _ = forward(x, eval_model.weights, eval_model.state, eval_model.rng)
  if inputs is not None:
    logits = logits[0]
  return decoding._log_softmax(  # pylint: disable=protected-access
      np.asarray(logits)[0, len(prefix)])


def _eval_greedy(eval_model, inputs, prompt, max_length):
  """Greedy decoding by re-running the eval-mode model at every step."""
  seq, out, score = list(prompt), [], 0.0
  for _ in range(max_length):
    log_p = _eval_log_probs(eval_model, inputs, seq)
    token = int(np.argmax(log_p))
    score += log_p[token]
    seq.append(token)
    out.append(token)
  return out, score


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_lm_predict_decoding_matches_eval_forward(variant):
  eval_model, model = _trained_pair(
      _tiny_lm, variant, shapes.ShapeDtype((1, 8), np.int32), seed=11)
  prompts = [[5, 9, 3], [7]]
  out, scores = decoding.decode(model, prompts, max_length=8, eos_id=None,
                                return_scores=True)
  for row, prompt, score in zip(out, prompts, scores):
    expected, expected_score = _eval_greedy(eval_model, None, prompt, 8)
    assert row.tolist() == expected
    np.testing.assert_allclose(score, expected_score, rtol=1e-4)


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_encdec_predict_decoding_matches_eval_forward(variant):
  # Inputs padded to one length: the sparse QKV encoder's centred
  # convolution sees the padding next to the last tokens.
  inputs = decoding.pad_batch([[5, 9, 3, 12, 30, 2], [7, 8]], 8)
  eval_model, model = _trained_pair(
      _tiny_encdec, variant, (shapes.ShapeDtype((1, 8), np.int32),
                              shapes.ShapeDtype((1, 8), np.int32)), seed=12)
  out, scores = decoding.decode(model, inputs, max_length=8, eos_id=None,
                                return_scores=True)
  for row, x, score in zip(out, inputs, scores):
    expected, expected_score = _eval_greedy(eval_model, x, [], 8)
    assert row.tolist() == expected
    np.testing.assert_allclose(score, expected_score, rtol=1e-4)


def test_greedy_matches_trax_autoregressive_sample():
  _, model = _trained_pair(_tiny_lm, 'sparse_ff_qkv_loss',
                           shapes.ShapeDtype((1, 8), np.int32), seed=13)
  ours = decoding.decode(model, None, batch_size=3, max_length=10,
                         eos_id=None)
  oracle = _tiny_lm('sparse_ff_qkv_loss', 'predict')
  oracle.init(shapes.ShapeDtype((3, 1), np.int32))
  oracle.weights = model.weights
  theirs = trax_decoding.autoregressive_sample(
      oracle, batch_size=3, temperature=0.0, eos_id=-1, max_length=10)
  np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize('make', [_tiny_lm, _tiny_encdec])
def test_beam_scores_are_eval_log_probs(make):
  # Beam hypotheses live in reordered predict-mode caches; their scores must
  # equal the log-probs that the eval-mode model gives the chosen outputs.
  encdec = make is _tiny_encdec
  sig = ((shapes.ShapeDtype((1, 6), np.int32),) * 2 if encdec
         else shapes.ShapeDtype((1, 6), np.int32))
  eval_model, model = _trained_pair(make, 'sparse_ff_qkv_loss', sig, seed=14)
  inputs = [[5, 9, 3, 12], [7, 8, 20]]
  if encdec:
    inputs = decoding.pad_batch(inputs, 8)  # The oracle sees the same pads.
  out, scores = decoding.decode(model, inputs, max_length=6, method='beam',
                                beam_size=3, eos_id=EOS, return_scores=True)
  greedy_scores = decoding.decode(model, inputs, max_length=6, eos_id=EOS,
                                  return_scores=True)[1]
  for row, x, score, greedy_score in zip(out, inputs, scores, greedy_scores):
    seq = decoding.strip_eos(row) + ([EOS] if EOS in row.tolist() else [])
    prompt = [] if encdec else list(x)
    total = sum(
        _eval_log_probs(eval_model, x if encdec else None,
                        prompt + seq[:i])[token]
        for i, token in enumerate(seq))
    np.testing.assert_allclose(score, total, rtol=1e-4)
    assert score >= greedy_score - 1e-5


@pytest.mark.parametrize('method, kwargs', [
    ('greedy', {}), ('beam', {'beam_size': 3})])
def test_batched_equals_one_by_one(method, kwargs):
  _, lm = _trained_pair(_tiny_lm, 'sparse_ff_qkv_loss',
                        shapes.ShapeDtype((1, 8), np.int32), seed=15)
  _, encdec = _trained_pair(
      _tiny_encdec, 'sparse_ff_qkv_loss',
      (shapes.ShapeDtype((1, 6), np.int32),) * 2, seed=20)
  inputs = [[5, 9, 3, 12, 30, 2, 4, 4, 7], [7, 8], [11, 3, 3]]
  for model in (lm, encdec):
    # One padded input length: padding is visible to the sparse encoder.
    batched = decoding.decode(model, inputs, max_length=7, eos_id=EOS,
                              method=method, input_length=16, **kwargs)
    one_by_one = decoding.decode_batches(
        model, inputs, batch_size=1, max_length=7, eos_id=EOS, method=method,
        input_length=16, progress=False, **kwargs)
    assert one_by_one == [decoding.strip_eos(row) for row in batched]
    assert len(set(map(tuple, one_by_one))) > 1  # Rows really differ.


def test_decode_batches_fills_the_last_batch():
  model = _markov_encdec(_eos_chain())
  inputs = [[5, 6, 7], [8], [9, 9]]
  assert decoding.decode_batches(model, inputs, batch_size=2, max_length=5,
                                 progress=False) == [[2, 3]] * 3
  lm = _markov_lm(TABLE)
  prompts = [[1], [2], [3], [4], [5]]
  batched = decoding.decode_batches(lm, prompts, batch_size=2, max_length=4,
                                    eos_id=None, progress=False)
  single = [decoding.decode(lm, [p], max_length=4, eos_id=None)[0].tolist()
            for p in prompts]
  assert batched == single


def test_decode_leaves_the_model_untouched():
  _, model = _trained_pair(_tiny_encdec, 'sparse_ff_qkv_loss',
                           (shapes.ShapeDtype((1, 6), np.int32),) * 2, seed=17)
  weights, state = model.weights, model.state
  first = decoding.decode(model, [[4, 5, 6]], max_length=5, method='beam',
                          beam_size=2)
  assert all(a is b for a, b in zip(jax.tree_util.tree_leaves(model.weights),
                                    jax.tree_util.tree_leaves(weights)))
  assert jax.tree_util.tree_structure(model.state) == (
      jax.tree_util.tree_structure(state))
  np.testing.assert_array_equal(
      decoding.decode(model, [[4, 5, 6]], max_length=5, method='beam',
                      beam_size=2), first)


def test_initial_state_equals_eager_init():
  model = _tiny_encdec('sparse_ff_qkv_loss', 'predict')
  sig = (shapes.ShapeDtype((3, 8), np.int32),
         shapes.ShapeDtype((3, 1), np.int32))
  _, eager = model.init(sig)
  fresh = decoding.initial_state(model, sig)
  assert (jax.tree_util.tree_structure(fresh) ==
          jax.tree_util.tree_structure(eager))
  for a, b in zip(jax.tree_util.tree_leaves(fresh),
                  jax.tree_util.tree_leaves(eager)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_model_max_length():
  assert decoding.model_max_length(_tiny_lm('dense', 'predict')) == 32
  assert decoding.model_max_length(_markov_lm(TABLE)) is None


def test_terraformer_decoding_matches_eval_forward():
  from terraformer.models import Terraformer  # pylint: disable=g-import-not-at-top
  tiny = dict(input_vocab_size=VOCAB, d_model=32, d_ff=64, n_heads=4,
              n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=32,
              ff_sparsity=8, d_lowrank=4, loss_sparsity=4, d_sru=8,
              attention_sparsity=4, encoder_attention_type='full',
              decoder_attention_type='full', predict_mem_len=32)
  make = lambda variant, mode: Terraformer(mode=mode, **tiny)
  inputs = decoding.pad_batch([[5, 9, 3, 12, 30, 2], [7, 8]], 8)
  eval_model, model = _trained_pair(
      make, None, (shapes.ShapeDtype((1, 8), np.int32),
                   shapes.ShapeDtype((1, ORACLE_LEN), np.int32)), seed=21)
  out, scores = decoding.decode(model, inputs, max_length=6, eos_id=None,
                                return_scores=True)
  for row, x, score in zip(out, inputs, scores):
    expected, expected_score = _eval_greedy(eval_model, x, [], 6)
    assert row.tolist() == expected
    np.testing.assert_allclose(score, expected_score, rtol=1e-4)
  beam, beam_scores = decoding.decode(model, inputs, max_length=6,
                                      method='beam', beam_size=2,
                                      eos_id=None, return_scores=True)
  for row, x, score in zip(beam, inputs, beam_scores):
    total = sum(_eval_log_probs(eval_model, x, row[:i].tolist())[token]
                for i, token in enumerate(row.tolist()))
    np.testing.assert_allclose(score, total, rtol=1e-4)


def test_state_donating_step_fn():
  # The default step donates (consumes) the state: same tokens as a step
  # that copies it.
  _, model = _trained_pair(_tiny_encdec, 'sparse_ff_qkv_loss',
                           (shapes.ShapeDtype((1, 6), np.int32),) * 2, seed=20)
  inputs = [[5, 9, 3, 12], [7, 8, 20]]
  copying = decode_step.make_step(model, donate_state=False)
  for kwargs in ({}, {'method': 'beam', 'beam_size': 2}):
    np.testing.assert_array_equal(
        decoding.decode(model, inputs, max_length=6, **kwargs),
        decoding.decode(model, inputs, max_length=6, step_fn=copying,
                        **kwargs))
  step = decoding.default_step_fn(model)
  x = (np.zeros((1, 4), np.int32), np.zeros((1, 1), np.int32))
  state = decoding.initial_state(model, decode_step.predict_signature(model, 4))
  _, state = step(x, model.weights, state, model.rng)   # Runs the encoder.
  _, new_state = step(x, model.weights, state, model.rng)
  assert all(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(state))
