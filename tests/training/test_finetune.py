"""Fine-tuning from a pretraining checkpoint: terraformer.train(init_checkpoint).

A tiny sparse LM is pretrained once (2 steps) and fine-tuned once (3 steps);
the tests check those runs, so the module trains only a few times.
"""
import contextlib
import functools
import io
import os

import gin
import numpy as np
import pytest
from trax import fastmath
from trax import shapes
from trax.supervised import callbacks
from trax.supervised import lr_schedules

from terraformer.checkpoint import format as checkpoint_format
from terraformer.training import finetune
from terraformer.training import loop as training
from terraformer.errors import TerraformerError
from terraformer.models import ScalingTransformerLM

VOCAB = 32


def counting_stream(seed):
  def stream():
    rng = np.random.RandomState(seed)
    while True:
      start = rng.randint(0, VOCAB, size=(4, 1))
      x = ((start + np.arange(16)[None]) % VOCAB).astype(np.int32)
      yield x, x, np.ones_like(x, np.float32)
  return stream


def tiny_sparse_lm(mode, d_ff=32, n_layers=1):
  return ScalingTransformerLM(
      vocab_size=VOCAB, d_model=16, d_ff=d_ff, n_layers=n_layers, n_heads=2,
      max_len=64, ff_sparsity=4, d_lowrank=4, dropout=0.0, mode=mode)


def _flat(tree):
  return [np.asarray(w) for w in fastmath.tree_flatten(tree)]


class FirstStep(callbacks.TrainingStepCallback):
  """Records weights and optimizer slots before the first step of a run."""
  weights = slots = None

  def __init__(self, loop):
    super().__init__(loop)
    FirstStep.weights = FirstStep.slots = None

  def call_at(self, step):
    return True

  def on_step_begin(self, step):
    if FirstStep.weights is None:
      FirstStep.weights = _flat(self._loop.model.weights)
      FirstStep.slots = _flat(self._loop._trainer_per_task[0].slots)  # pylint: disable=protected-access

  def on_step_end(self, step):
    pass


def _train(output_dir, steps, seed, model=tiny_sparse_lm, **kwargs):
  return training.train(
      str(output_dir), model=model, train_stream=counting_stream(seed),
      eval_stream=counting_stream(seed + 100), steps=steps,
      lr_schedule_fn=functools.partial(lr_schedules.constant, 0.01),
      eval_every=steps, eval_batches=1, checkpoint_every=steps,
      random_seed=seed, callbacks=[FirstStep], **kwargs)


def _assert_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


def _differ(a, b):
  return any(not np.array_equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
  """A tiny pretraining run (2 steps): its directory and final weights."""
  output_dir = tmp_path_factory.mktemp('pretrain')
  loop = _train(output_dir, 2, seed=0)
  return output_dir, _flat(loop.model.weights)


@pytest.fixture(scope='module')
def finetuned(pretrained, tmp_path_factory):
  """Fine-tunes 3 steps from `pretrained`, with another seed."""
  output_dir = tmp_path_factory.mktemp('finetune')
  printed = io.StringIO()
  # Through the gin binding, naming the checkpoint file (not its directory).
  checkpoint = pretrained[0] / 'model.pkl.gz'
  gin.parse_config(f"terraformer.train.init_checkpoint = '{checkpoint}'")
  try:
    with contextlib.redirect_stdout(printed):
      loop = _train(output_dir, 3, seed=5)
  finally:
    gin.clear_config()
  return {'dir': output_dir, 'loop': loop, 'first_weights': FirstStep.weights,
          'first_slots': FirstStep.slots, 'printed': printed.getvalue(),
          'weights': _flat(loop.model.weights)}


def test_fine_tuning_starts_from_the_checkpoint_weights(pretrained,
                                                        finetuned):
  pretrain_dir, pretrained_weights = pretrained
  # The checkpoint on disk holds the pretrained weights.
  _assert_equal(checkpoint_format.load_flat_weights(str(pretrain_dir))[0],
                pretrained_weights)
  # A fresh model starts elsewhere, the fine-tune from the checkpoint...
  fresh = tiny_sparse_lm('train')
  fresh.init(shapes.ShapeDtype((4, 16), np.int32),
             rng=fastmath.random.get_prng(5))
  assert _differ(_flat(fresh.weights), pretrained_weights)
  _assert_equal(finetuned['first_weights'], pretrained_weights)
  assert f"Fine-tuning from {pretrain_dir / 'model.pkl.gz'}" in finetuned[
      'printed']
  assert os.path.isfile(finetuned['dir'] / 'model.pkl.gz')
  # ... at step 1 with a fresh history, and then it trains.
  loop = finetuned['loop']
  assert loop.step == 3
  assert [s for s, _ in loop.history.get('train', 'metrics/loss')] == [1, 3]
  assert _differ(finetuned['weights'], pretrained_weights)


def test_optimizer_state_starts_fresh(pretrained, finetuned):
  saved = checkpoint_format.read_trax_checkpoint(
      str(pretrained[0] / 'model.pkl.gz'))['slots_per_task'][0]
  assert any(np.abs(s).sum() > 0 for s in saved)  # Pretraining's Adam moments.
  slots = finetuned['first_slots']
  assert len(slots) == len(saved)
  assert all(not s.any() for s in slots)


def test_resuming_takes_precedence_over_init_checkpoint(pretrained, finetuned,
                                                        capsys):
  loop = _train(finetuned['dir'], 4, seed=5,
                init_checkpoint=str(pretrained[0]))
  out = capsys.readouterr().out
  assert 'Resuming from checkpoint at step 3' in out
  assert 'not loaded: resuming from the checkpoint in output_dir' in out
  assert 'Fine-tuning from' not in out
  _assert_equal(FirstStep.weights, finetuned['weights'])
  assert loop.step == 4


def test_mismatch_names_the_first_differing_weight(pretrained, tmp_path):
  pretrain_dir, _ = pretrained
  output_dir = tmp_path / 'wide'
  wide = functools.partial(tiny_sparse_lm, d_ff=64)
  with pytest.raises(TerraformerError) as error:
    _train(output_dir, 1, seed=0, model=wide,
           init_checkpoint=str(pretrain_dir))
  # (Gin adds a line naming the configurable.)
  assert str(error.value).splitlines()[0].startswith(
      f'checkpoint {pretrain_dir}/model.pkl.gz does not match the model: '
      'Serial[5]/Serial[0]/Branch[1]/Parallel[1]/Serial[1]/SparseFF_64_N4'
      '.weights[1]: checkpoint (4, 32) vs model (4, 64); nor as a Trax 1.4.1 '
      'checkpoint: Trax layout does not match the model: ')
  assert not output_dir.exists()  # Nothing written.


def test_tree_structure_mismatch(pretrained, tmp_path):
  deep = functools.partial(tiny_sparse_lm, n_layers=2)
  # The checkpoint's final LayerNorm (16,) meets layer 2's attention and
  # then its output Dense (16, 32) meets layer 2's query Dense (16, 16).
  with pytest.raises(TerraformerError, match=(
      r'Serial\[6\]/Serial\[0\]/Branch\[1\]/.*/Dense_16\.weights\[0\]: '
      r'checkpoint \(16, 32\) vs model \(16, 16\)')):
    _train(tmp_path / 'deep', 1, seed=0, model=deep,
           init_checkpoint=str(pretrained[0]))


def test_named_weights_and_count_mismatch():
  model = tiny_sparse_lm('train')
  model.init(shapes.ShapeDtype((4, 16), np.int32))
  named = finetune.named_weights(model)
  assert [n for n, _ in named[:2]] == ['Serial[1]/Embedding_32_16.weights',
                                       'Serial[3]/PositionalEncoding.weights']
  assert len(named) == len(fastmath.tree_flatten(model.weights))
  arrays = [np.asarray(w) for _, w in named]
  with pytest.raises(TerraformerError, match=r'Serial\[7\]/Dense_32\.weights'
                     r'\[1\]: missing in the checkpoint \(it has 23 weight '
                     r'arrays, the model 24\)'):
    finetune.match(arrays[:-1], named)
  with pytest.raises(TerraformerError, match='has 25 weight arrays, the model '
                     r'24; the first extra one has shape \(3,\)'):
    finetune.match(arrays + [np.zeros(3)], named)
  matched = finetune.match([a.astype(np.float64) for a in arrays], named)
  assert all(m.dtype == np.float32 for m in matched)


def test_missing_checkpoint_is_an_error_before_writing(tmp_path):
  output_dir = tmp_path / 'out'
  with pytest.raises(TerraformerError, match='no checkpoint'):
    _train(output_dir, 1, seed=0, init_checkpoint=str(tmp_path))
  with pytest.raises(TerraformerError, match='not found'):
    _train(output_dir, 1, seed=0, init_checkpoint=str(tmp_path / 'nope'))
  (tmp_path / 'x.txt').write_text('x')
  with pytest.raises(TerraformerError, match='not a Trax checkpoint'):
    _train(output_dir, 1, seed=0, init_checkpoint=str(tmp_path / 'x.txt'))
  assert not output_dir.exists()


def test_init_checkpoint_accepts_a_trax_checkpoint(tmp_path):
  """A checkpoint of Trax's ConfigurableTransformerLM, imported on the fly."""
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))  # tests/trax_checkpoints.py
  import trax_checkpoints as tc  # pylint: disable=g-import-not-at-top
  from terraformer.trax_bridge import checkpoint_import as trax_import  # pylint: disable=g-import-not-at-top
  signature = tc.int_signature((4, 16))
  trax_model = tc.trax_lm('eval', vocab_size=VOCAB, d_model=16, d_ff=32,
                          n_layers=1, n_heads=2, max_len=64, dropout=0.0,
                          ff_sparsity=(4, 4))
  tc.random_weights(trax_model, signature, seed=9)
  path = tc.save_with_trax(trax_model, str(tmp_path / 'trax'), (signature,))
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    loop = _train(tmp_path / 'out', 1, seed=0, init_checkpoint=path)
  assert 'Fine-tuning from' in printed.getvalue()
  flat, _ = checkpoint_format.load_flat_weights(path)
  imported = trax_import.import_weights(tiny_sparse_lm('eval'), flat)
  _assert_equal(FirstStep.weights, _flat(imported))
  # The imported model computes Trax's function.
  tokens = np.random.RandomState(1).randint(1, VOCAB, (4, 16)).astype(
      np.int32)
  ours = tc.with_weights(tiny_sparse_lm('eval'), imported, signature)
  np.testing.assert_allclose(np.asarray(ours(tokens)),
                             np.asarray(trax_model(tokens)), atol=1e-4)
  assert loop.step == 1
