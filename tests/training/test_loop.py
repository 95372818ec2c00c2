"""terraformer.training.loop.train: learning, resuming, data parallelism."""
import dataclasses
import functools
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap

import gin
import numpy as np
import pytest
import tensorflow as tf
import trax
from trax import fastmath
from trax.supervised import callbacks
from trax.supervised import lr_schedules

from terraformer.checkpoint import format as checkpoint_format
from terraformer.checkpoint import store as checkpoints
from terraformer.trax_bridge import compat
from terraformer import distributed
from terraformer import errors
from terraformer.training import loop as training
from terraformer.training import run_lock

compat.apply()

VOCAB = 32


def counting_stream(batch_size=4, length=16, seed=0, fixed=False):
  """Returns a stream function: rows count up mod VOCAB from a random start.

  The next token is the previous plus one: easy to learn. With `fixed`, every
  batch is the same (so training is a deterministic function of the step).
  """
  def stream():
    rng = np.random.RandomState(seed)
    while True:
      start = rng.randint(0, VOCAB, size=(batch_size, 1))
      x = ((start + np.arange(length)[None]) % VOCAB).astype(np.int32)
      yield x, x, np.ones_like(x, np.float32)
      if fixed:
        rng = np.random.RandomState(seed)
  return stream


def tiny_lm(mode):
  return trax.models.TransformerLM(
      VOCAB, d_model=16, d_ff=32, n_layers=1, n_heads=2, max_len=64,
      dropout=0.0, mode=mode)


def _train(output_dir, steps, **kwargs):
  args = dict(model=tiny_lm, train_stream=counting_stream(),
              eval_stream=counting_stream(seed=1), steps=steps,
              lr_schedule_fn=functools.partial(lr_schedules.constant, 0.01),
              eval_every=steps, eval_batches=2, checkpoint_every=steps,
              random_seed=0)
  args.update(kwargs)
  return training.train(str(output_dir), **args)


def _scalar_steps(folder, tag):
  """Steps at which the TensorBoard event files in `folder` have `tag`."""
  steps = []
  for path in glob.glob(str(folder / 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      steps += [event.step for v in event.summary.value if v.tag == tag]
  return sorted(steps)


def _flat(weights):
  return [np.asarray(w) for w in fastmath.tree_flatten(weights)]


class Recorder(callbacks.TrainingStepCallback):
  """Records the steps run and the model weights before the first one."""
  instances = []

  def __init__(self, loop):
    super().__init__(loop)
    self.steps, self.first_weights = [], None
    Recorder.instances.append(self)

  def call_at(self, step):
    return True

  def on_step_begin(self, step):
    if not self.steps:
      self.first_weights = _flat(self._loop.model.weights)
    self.steps.append(step)

  def on_step_end(self, step):
    pass


def test_loss_falls_and_outputs_are_written(tmp_path, capsys):
  loop = _train(tmp_path, 40, eval_every=20)
  evals = loop.history.get('eval', 'metrics/log_perplexity')
  assert [step for step, _ in evals] == [1, 20, 40]
  assert evals[-1][1] < evals[0][1] - 1.0  # Nats per token.
  losses = loop.history.get('train', 'metrics/loss')
  assert losses[-1][1] < losses[0][1] - 1.0
  accuracy = loop.history.get('eval', 'metrics/accuracy')
  assert accuracy[-1][1] > accuracy[0][1]
  assert os.path.exists(tmp_path / 'model.pkl.gz')
  assert not os.path.exists(tmp_path / run_lock.LOCK_FILE)  # Released.
  assert _scalar_steps(tmp_path / 'train', 'metrics/loss') == [1, 20, 40]
  assert _scalar_steps(tmp_path / 'eval', 'metrics/log_perplexity') == [
      1, 20, 40]
  out = capsys.readouterr().out
  progress = [l for l in out.splitlines() if l.startswith('step ')]
  assert [l.split()[1] for l in progress] == ['1/40', '20/40', '40/40']
  assert all('train loss' in l and 'eval log_perplexity' in l
             for l in progress)


def test_resume_continues_from_checkpoint(tmp_path):
  # A stream that differs batch to batch: resuming must skip the batches used.
  fixed = dict(train_stream=counting_stream(), callbacks=[Recorder])
  Recorder.instances.clear()
  first = _train(tmp_path / 'resumed', 4, **fixed)
  assert first.step == 4
  saved = _flat(first.model.weights)
  second = _train(tmp_path / 'resumed', 8, **fixed)
  run1, run2 = Recorder.instances
  assert run1.steps == [1, 2, 3, 4]
  assert run2.steps == [5, 6, 7, 8] and second.step == 8
  # The second run starts from the saved weights, not from a fresh init.
  assert len(run2.first_weights) == len(saved)
  for a, b in zip(run2.first_weights, saved):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, b)
             for a, b in zip(run1.first_weights, saved))
  # 4 + 4 steps give bit-identical weights to 8 in one go: optimizer slots,
  # rng and stream position are restored.
  straight = _train(tmp_path / 'straight', 8, **fixed)
  for a, b in zip(_flat(second.model.weights), _flat(straight.model.weights)):
    np.testing.assert_array_equal(a, b)
  # Asking for no more steps than done trains nothing.
  again = _train(tmp_path / 'resumed', 8, **fixed)
  assert again.step == 8 and Recorder.instances[-1].steps == []


@pytest.mark.parametrize('weight_sharding', ['replicated', 'fsdp'])
def test_resume_with_other_bindings_rewrites_config_gin(tmp_path, capsys,
                                                         weight_sharding):
  # Both loops write config.gin after step 1 only; a resumed run with other
  # bindings (a curriculum's next stage) must not keep the first start's.
  train = functools.partial(_train, tmp_path, weight_sharding=weight_sharding)
  try:
    gin.parse_config('Adam.eps = 1e-5')
    train(2)
    first = (tmp_path / 'config.gin').read_text()
    assert 'Adam.eps = 1e-05' in first
    train(4)  # The same bindings: nothing rewritten or kept.
    assert (tmp_path / 'config.gin').read_text() == first
    assert not glob.glob(str(tmp_path / 'config.until_step_*.gin'))
    gin.parse_config('Adam.eps = 1e-3')
    train(6)
  finally:
    gin.clear_config()
  assert 'Adam.eps = 0.001' in (tmp_path / 'config.gin').read_text()
  assert (tmp_path / 'config.until_step_4.gin').read_text() == first
  assert 'earlier one kept as' in capsys.readouterr().out


def _stream_with_nan_at(step):
  """counting_stream whose batch `step` has NaN weights (a NaN loss)."""
  def stream():
    for i, (x, y, w) in enumerate(counting_stream()(), 1):
      yield x, y, (w * np.nan if i == step else w)
  return stream


def test_non_finite_loss_stops_training_before_its_checkpoint(tmp_path):
  with pytest.raises(errors.TerraformerError, match=(
      r'^non-finite loss \(nan\) at step 3: training stopped, nothing saved '
      r'for this step; last checkpoint: step 2')):
    _train(tmp_path, 4, checkpoint_every=1, train_stream=_stream_with_nan_at(3))
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['1', '2']
  assert not os.path.exists(tmp_path / run_lock.LOCK_FILE)  # Released.
  saved = checkpoint_format.read_trax_checkpoint(str(tmp_path / 'model.pkl.gz'))
  assert saved['step'] == 2
  assert all(np.isfinite(w).all() for w in saved['flat_weights'])
  # A run from before checkpoints/ (only Trax's model.pkl.gz) still resumes.
  shutil.rmtree(tmp_path / 'checkpoints')
  loop = _train(tmp_path, 3, callbacks=[Recorder])
  assert Recorder.instances[-1].first_weights is not None
  for a, b in zip(Recorder.instances[-1].first_weights,
                  saved['flat_weights']):
    np.testing.assert_array_equal(a, b)
  assert loop.step == 3 and checkpoints.committed_steps(str(tmp_path)) == [3]


def test_skip_non_finite_undoes_and_counts_the_step(tmp_path, capsys):
  at_begin = {}

  class WeightsAtBegin(Recorder):
    def on_step_begin(self, step):
      at_begin[step] = _flat(self._loop.model.weights)

  loop = _train(tmp_path, 4, skip_non_finite=True,
                train_stream=_stream_with_nan_at(3), callbacks=[WeightsAtBegin])
  assert loop.step == 4 and loop.skipped_steps == 1
  assert 'Skipped step 3: non-finite loss (nan); 1 skipped so far' in (
      capsys.readouterr().out)
  assert all(np.isfinite(w).all() for w in _flat(loop.model.weights))
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not same(at_begin[2], at_begin[3])  # Step 2 trained ...
  assert same(at_begin[3], at_begin[4])  # ... step 3 was undone.


def test_empty_stream_is_a_user_error_and_writes_nothing(tmp_path):
  out = tmp_path / 'out'
  with pytest.raises(errors.TerraformerError, match='train_stream'):
    _train(out, 2, train_stream=lambda: iter([]))
  assert not out.exists()


_DATA_PARALLEL_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests_dir!r})
    import jax
    # Before Trax: compat fix 0 (without it, `import trax` takes ~45 CPU-s).
    import terraformer
    import test_loop as t
    from terraformer import errors
    out = sys.argv[1]
    loop = t._train(out + '/run', 30, eval_every=10)
    resumed = t._train(out + '/run', 32, eval_every=10)
    try:
      t._train(out + '/odd', 2, train_stream=t.counting_stream(batch_size=3))
      odd = 'no error'
    except errors.TerraformerError as e:
      odd = str(e)
    evals = loop.history.get('eval', 'metrics/log_perplexity')
    print('RESULT ' + json.dumps({{
        'devices': jax.local_device_count(), 'loop_devices': loop.n_devices,
        'first': evals[0][1], 'last': evals[-1][1],
        'resumed_step': resumed.step, 'odd': odd}}))
""")


def test_data_parallel_on_two_devices(tmp_path):
  script = _DATA_PARALLEL_SCRIPT.format(
      tests_dir=os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, XLA_FLAGS=distributed.force_host_devices(2),
             JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', script, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=400)
  assert out.returncode == 0, out.stderr[-3000:]
  line = [l for l in out.stdout.splitlines() if l.startswith('RESULT ')][-1]
  result = json.loads(line[len('RESULT '):])
  assert result['devices'] == 2 and result['loop_devices'] == 2
  assert result['last'] < result['first'] - 0.5
  assert result['resumed_step'] == 32
  assert 'not divisible' in result['odd'] and '(2)' in result['odd']
  assert not os.path.exists(tmp_path / 'odd')


def test_every_evaluation_sees_the_same_batches(tmp_path):
  drawn = []
  counting = counting_stream(seed=1)

  def eval_stream():
    for batch in counting():
      drawn.append(batch)
      yield batch

  loop = _train(tmp_path / 'run', steps=4, eval_every=2,
                eval_stream=eval_stream)
  evals = loop.history.get('eval', 'metrics/loss')
  assert [step for step, _ in evals] == [1, 2, 4]
  assert len(drawn) == 2  # only the first eval_batches batches are drawn


def test_settings_are_the_terraformer_train_bindings():
  """`terraformer.train.*` binds `TrainSettings`; arguments take precedence;
  the schedule follows the bound frequencies."""
  try:
    gin.parse_config(['terraformer.train.steps = 7',
                      'terraformer.train.eval_every = 3',
                      'terraformer.train.checkpoint_every = None',
                      'terraformer.train.permanent_checkpoint_every = 2'])
    gin.bind_parameter('terraformer.train.model', tiny_lm)
    gin.bind_parameter('terraformer.train.train_stream', counting_stream())
    gin.bind_parameter('terraformer.train.eval_stream', counting_stream())
    settings = training.TrainSettings()
    assert gin.query_parameter('terraformer.train.steps') == 7
    assert (settings.steps, settings.eval_every, settings.model) == (
        7, 3, tiny_lm)
    assert training.TrainSettings(steps=5).steps == 5
  finally:
    gin.clear_config()
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.steps = 8
  steps = range(1, 8)
  assert [s for s in steps if settings.eval_at(s)] == [1, 3, 6, 7]
  assert [s for s in steps if settings.checkpoint_at(s)] == [7]
  assert [s for s in steps if settings.permanent_checkpoint_at(s)] == [
      2, 4, 6]
  with pytest.raises(RuntimeError, match='model'):
    training.TrainSettings()  # Unbound: gin names the missing binding.


def test_importing_training_applies_compat_fixes():
  code = ('import terraformer.training.loop; '
          'from terraformer.trax_bridge import compat; '
          'print(",".join(sorted(compat._APPLIED)))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, check=True).stdout.strip().splitlines()[-1]
  assert out.split(',') == sorted(compat.PATCHES)
