"""Terraformer: contract, reversible == plain gradients, predict == eval."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import shapes

from terraformer.trax_bridge import compat
from terraformer.models import Terraformer

import peak_rss  # tests/peak_rss.py

compat.apply()

VOCAB = 64
TINY = dict(input_vocab_size=VOCAB, d_model=32, d_ff=64, n_encoder_layers=1,
            n_decoder_layers=1, n_heads=4, dropout=0.0, max_len=64,
            ff_sparsity=8, d_lowrank=4, loss_sparsity=4, d_sru=8,
            lsh_chunk_len=4, lsh_n_hashes=2)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _tokens(shape, seed):
  return np.random.RandomState(seed).randint(1, VOCAB, size=shape).astype(
      np.int32)


def _model(mode, **kwargs):
  return Terraformer(mode=mode, **{**TINY, **kwargs})


def test_contract_logits_for_decoder_positions_only():
  inputs, targets = _tokens((2, 16), 0), _tokens((2, 8), 1)
  model = _model('eval', encoder_attention_type='lsh',
                 decoder_attention_type='lsh', attention_sparsity=4)
  model.init(shapes.signature((inputs, targets)), rng=jax.random.PRNGKey(0))
  state = model.state
  logits, out_targets = model((inputs, targets))
  assert logits.shape == (2, 8, VOCAB)
  np.testing.assert_array_equal(np.asarray(out_targets), targets)
  # The encoder is used: changing an input token changes the logits.
  changed = inputs.copy()
  changed[:, 3] = changed[:, 3] % (VOCAB - 1) + 1
  model.state = state  # LSH draws its hashing rotations from the state.
  other, _ = model((changed, targets))
  assert not np.allclose(np.asarray(other), np.asarray(logits), atol=1e-5)


def test_targets_are_causal():
  inputs, targets = _tokens((1, 8), 2), _tokens((1, 8), 3)
  model = _model('eval', encoder_attention_type='full',
                 decoder_attention_type='full')
  model.init(shapes.signature((inputs, targets)), rng=jax.random.PRNGKey(0))
  changed = targets.copy()
  changed[0, 5] = changed[0, 5] % (VOCAB - 1) + 1
  a = np.asarray(model((inputs, targets))[0])
  b = np.asarray(model((inputs, changed))[0])
  # Targets are shifted right: changing target 5 changes logits from 6 on.
  np.testing.assert_allclose(a[:, :6], b[:, :6], atol=1e-5)
  assert not np.allclose(a[:, 6:], b[:, 6:], atol=1e-5)


def test_reversible_gradients_equal_plain_backprop():
  """Same weights, state and rng: reversible == plain autodiff (§4.2)."""
  inputs, targets = _tokens((2, 16), 4), _tokens((2, 8), 5)
  inputs[1, 12:] = 0
  config = dict(encoder_attention_type='lsh', decoder_attention_type='lsh',
                attention_sparsity=4, dropout=0.1, ff_quant_prob=1.0)
  models = {r: _model('train', reversible=r, **config) for r in (True, False)}
  sig = shapes.signature((inputs, targets))
  for model in models.values():
    model.init(sig, rng=jax.random.PRNGKey(6))
  weights = models[True].weights

  def grads(model):
    def loss(w):
      (logits, _), new_state = model.pure_fn(
          (inputs, targets), w, model.state, jax.random.PRNGKey(7))
      return jnp.mean(jax.nn.log_softmax(logits)[..., 1]), new_state
    return jax.jit(jax.grad(loss, has_aux=True))(weights)

  (g_rev, s_rev), (g_plain, s_plain) = grads(models[True]), grads(
      models[False])
  leaves_rev = jax.tree_util.tree_leaves(g_rev)
  leaves_plain = jax.tree_util.tree_leaves(g_plain)
  scale = max(float(jnp.max(jnp.abs(g))) for g in leaves_plain)
  for a, b in zip(leaves_rev, leaves_plain):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                               atol=1e-4 * scale, rtol=1e-3)
  # Both passes hashed into the same LSH buckets (int32 [batch * heads,
  # n_hashes * length] state leaves) ...
  def buckets(state):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(state)
            if x.dtype == jnp.int32 and x.ndim == 2]
  assert len(buckets(s_rev)) == 3  # 1 encoder + 2 decoder attentions.
  for a, b in zip(buckets(s_rev), buckets(s_plain)):
    np.testing.assert_array_equal(a, b)
  # ... and only the reversible model keeps its sparse FF decisions (uint8).
  decisions = [x for x in jax.tree_util.tree_leaves(s_rev)
               if x.dtype == jnp.uint8]
  assert len(decisions) == 2 and all(np.asarray(d).any() for d in decisions)
  assert not [x for x in jax.tree_util.tree_leaves(s_plain)
              if x.dtype == jnp.uint8]


def _predict_matches_eval(pad=True, **config):
  inputs, targets = _tokens((2, 6), 8), _tokens((2, 4), 9)
  if pad:
    inputs[0, 4:] = 0
  eval_model = _model('eval', **config)
  eval_model.init(shapes.signature((inputs, targets)),
                  rng=jax.random.PRNGKey(10))
  full_logits = np.asarray(eval_model((inputs, targets))[0])

  predict_model = _model('predict', **config)
  predict_model.init((shapes.signature(inputs),
                      shapes.ShapeDtype((2, 1), np.int32)))
  predict_model.weights = eval_model.weights
  shifted = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  step_logits = [np.asarray(predict_model((inputs, shifted[:, i:i + 1]))[0])
                 for i in range(targets.shape[1])]
  np.testing.assert_allclose(np.concatenate(step_logits, axis=1),
                             full_logits, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize('pad', [False, True])
def test_predict_matches_eval_lsh_decoder(pad):
  # One LSH chunk holds the whole concatenation (6 + 4 positions): LSH
  # attention over it is exact, so decoding must match evaluation; with
  # padding, only if no step reads the junk positions after a padded
  # example's first decoder position (DecoderLSHCore).
  _predict_matches_eval(pad=pad, encoder_attention_type='full',
                        decoder_attention_type='lsh', attention_sparsity=4,
                        lsh_chunk_len=10, predict_mem_len=16,
                        predict_drop_len=4)


@pytest.mark.slow
@pytest.mark.parametrize('sparsity', [0, 4])
def test_predict_matches_eval_full_attention(sparsity):
  _predict_matches_eval(encoder_attention_type='full',
                        decoder_attention_type='full',
                        attention_sparsity=sparsity, predict_mem_len=16)


@pytest.mark.slow
def test_trains_on_8k_token_inputs_with_bounded_memory(tmp_path):
  """gin/tiny/terraformer_8k.gin: 3 steps on 8192-token papers, in a child
  process whose peak RSS is bounded (the whole process: Python, TF, data)."""
  exe = os.path.join(os.path.dirname(sys.executable), 'terraformer-train')
  code, stdout, stderr, peak_kib = peak_rss.run(
      [exe, '--config_file=' + os.path.join(REPO, 'gin', 'tiny',
                                            'terraformer_8k.gin'),
       f'--output_dir={tmp_path / "run"}', '--steps=3',
       '--config=terraformer.train.eval_every=3',
       '--config=terraformer.train.eval_batches=1'], timeout=1800)
  assert code == 0, stderr[-3000:]
  assert 'Done: step 3' in stdout
  assert peak_kib < 6 * 2**20, f'peak RSS {peak_kib / 2**20:.1f} GiB'
  losses = [float(line.split('eval log_perplexity ')[1].split()[0])
            for line in stdout.splitlines() if 'eval log_perplexity' in line]
  assert losses and all(np.isfinite(losses))


def test_lsh_evaluation_is_deterministic():
  """Two eval calls on the same batch give identical logits when
  lsh_eval_seed fixes the hashing keys; with lsh_eval_seed=None the hashing
  keys in the state advance and the logits differ."""
  inputs, targets = _tokens((2, 16), 11), _tokens((2, 8), 12)
  outputs = {}
  for seed in (0, None):
    model = _model('eval', encoder_attention_type='lsh',
                   decoder_attention_type='lsh', lsh_eval_seed=seed)
    model.init(shapes.signature((inputs, targets)),
               rng=jax.random.PRNGKey(13))
    outputs[seed] = [np.asarray(model((inputs, targets))[0])
                     for _ in range(2)]
  np.testing.assert_array_equal(outputs[0][0], outputs[0][1])
  assert np.abs(outputs[None][0] - outputs[None][1]).max() > 1e-4
