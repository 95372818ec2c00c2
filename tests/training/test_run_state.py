"""The rules both loops share (terraformer/training/run_state.py): a step's
checkpoints after its evals, the summaries and lines of Trax's Loop,
config.gin. The loops using them: tests/training/test_loop.py (both loops'
config.gin, resume, NaN guard), tests/training/test_resume_sweep*.py (exact
resume at a step that both evaluates and checkpoints)."""
import gin
import numpy as np
import pytest
from trax.supervised import history as trax_history
from trax.supervised import training as trax_training

from terraformer.training import run_state


class Writer:
  """A TensorBoard summary writer that records its calls."""

  def __init__(self):
    self.calls = []

  def scalar(self, tag, value, step):
    self.calls.append(('scalar', tag, value, step))

  def image(self, tag, value, step):
    self.calls.append(('image', tag, np.shape(value), step))

  def text(self, tag, value):
    self.calls.append(('text', tag))

  def flush(self):
    self.calls.append(('flush',))


def _saves(eval_steps):
  saved = []
  rule = run_state.EvalsBeforeCheckpoints(lambda step: step in eval_steps,
                                          saved.append)
  return rule, saved


def test_a_step_with_evals_saves_its_checkpoints_after_them():
  rule, saved = _saves(eval_steps={3})
  rule.save(3, 'model')
  rule.save(3, 'model_3')
  assert saved == []  # Waiting for the evals of step 3.
  rule.evals_done(3)
  assert saved == ['model', 'model_3']
  rule.save(3, 'lowest_loss')  # Asked after the evals: at once.
  assert saved == ['model', 'model_3', 'lowest_loss']
  rule.evals_done(3)  # Nothing waits: nothing saved twice.
  assert saved == ['model', 'model_3', 'lowest_loss']


def test_a_step_without_evals_saves_at_once():
  rule, saved = _saves(eval_steps={3})
  rule.save(2, 'model')
  assert saved == ['model']
  rule.evals_done(2)
  assert saved == ['model']


class _TraxLoopLogging:
  """What `trax.supervised.training.Loop.log_summary` reads of its loop."""
  log_summary = trax_training.Loop.log_summary
  _log_step = trax_training.Loop._log_step  # pylint: disable=protected-access
  is_chief = True
  _rjust_len = max(map(len, ['loss'] + list(run_state.EVAL_METRICS)))

  def __init__(self, step):
    self.step = step
    self._history = trax_history.History()


def _entries(history):
  """(mode, metric, step, value or an array's shape) of a Trax History."""
  return [(mode, metric, step, np.shape(value) if np.ndim(value) else value)
          for mode in history.modes
          for metric in history.metrics_for_mode(mode)
          for step, value in history.get(mode, metric)]


@pytest.mark.parametrize('stdout', [True, False])
def test_summary_is_trax_loops_log_summary(tmp_path, capsys, stdout):
  values = {'loss': 2.5, 'accuracy': np.float32(0.25),
            'log_perplexity': 123456.125, 'image': np.zeros((2, 2, 3))}
  trax_loop, trax_writer = _TraxLoopLogging(123456), Writer()
  trax_loop.log_summary(values, trax_writer, 'metrics/', 'eval',
                        stdout=stdout)
  trax_lines = capsys.readouterr().out
  history, writer = trax_history.History(), Writer()
  trax_log = trax_training._log  # pylint: disable=protected-access
  run_state.RunLog(str(tmp_path), log=trax_log).summary(
      history, 123456, values, writer, 'metrics/', 'eval', stdout=stdout)
  assert capsys.readouterr().out == trax_lines
  assert ('Step  123456: eval  log_perplexity |  123456.12500000'
          in trax_lines) == stdout
  assert writer.calls == trax_writer.calls
  assert _entries(history) == _entries(
      trax_loop._history)  # pylint: disable=protected-access


def test_summary_of_a_process_without_output_dir_writes_no_events(capsys):
  history, writer = trax_history.History(), Writer()
  run_state.RunLog(None).summary(history, 2, {'loss': 1.0}, writer,
                                 'metrics/', 'train')
  assert writer.calls == []
  assert capsys.readouterr().out == (
      'Step      2: train           loss |  1.00000000\n')
  assert history.get('train', 'metrics/loss') == [(2, 1.0)]


def test_summary_takes_the_means_over_processes_of_the_scalars():
  history = trax_history.History()
  seen = []

  def mean(values):
    seen.append(list(values))
    return [2 * v for v in values]
  run_state.RunLog(None, mean=mean).summary(
      history, 1, {'loss': 1.5, 'image': np.zeros((2, 2))}, None,
      'metrics/', 'train', stdout=False)
  assert seen == [[1.5]]
  assert history.get('train', 'metrics/loss') == [(1, 3.0)]


def _train_log(run_log, history, step, writer, steps=2):
  since_eval = {'loss': 3.0 * steps, 'steps': steps,
                'stats': {'gradients_l2': 0.5 * steps}}
  run_log.train(history, step, writer, since_eval, elapsed=1.25,
                learning_rate=0.01, steps_per_second=4.0)


def test_train_log_means_since_the_last_eval_and_config_gin_at_step_1(
    tmp_path, capsys):
  history, writer = trax_history.History(), Writer()
  _train_log(run_state.RunLog(str(tmp_path)), history, 1, writer)
  lines = capsys.readouterr().out.splitlines()
  assert lines == ['Step      1: Ran 2 train steps in 1.25 secs',
                   'Step      1: train           loss |  3.00000000']
  assert history.get('train', 'metrics/loss') == [(1, 3.0)]
  assert history.get('train', 'training/gradients_l2') == [(1, 0.5)]
  assert history.get('train', 'training/learning_rate') == [(1, 0.01)]
  assert history.get('train', 'training/steps per second') == [(1, 4.0)]
  assert (tmp_path / 'config.gin').read_text() == gin.operative_config_str()
  # config.gin between the train loss and the training/ metrics, as Trax's
  # Loop writes it.
  tags = [call[1] for call in writer.calls if len(call) > 1]
  assert tags == ['metrics/loss', 'gin_config', 'training/learning_rate',
                  'training/steps per second', 'training/gradients_l2']


def test_train_log_of_only_skipped_steps_says_so(tmp_path, capsys):
  history = trax_history.History()
  _train_log(run_state.RunLog(str(tmp_path)), history, 4, None, steps=0)
  assert 'Ran 0 train steps' in capsys.readouterr().out
  assert history.get('train', 'metrics/loss') == [(4, 0.0)]
  assert not (tmp_path / 'config.gin').exists()  # Not step 1, no resume.


@gin.configurable(module='test_run_state')
def rate(value=1.0):
  return value


def _bind_rate(value):
  """Binds `rate.value` and calls `rate`: a binding of the operative
  config."""
  gin.parse_config(f'test_run_state.rate.value = {value}')
  assert rate() == value


def test_a_resumed_run_rewrites_config_gin_when_its_bindings_changed(
    tmp_path, capsys):
  history = trax_history.History()
  try:
    _bind_rate(2.5)
    run_log = run_state.RunLog(str(tmp_path))
    run_log.started(0)
    _train_log(run_log, history, 1, None)
    first = (tmp_path / 'config.gin').read_text()
    run_log.started(4)  # The same bindings: kept as it is.
    _train_log(run_log, history, 5, None)
    assert (tmp_path / 'config.gin').read_text() == first
    _bind_rate(0.5)
    run_log.started(6)
    _train_log(run_log, history, 7, None)
    assert 'earlier one kept as' in capsys.readouterr().out
    _train_log(run_log, history, 8, None)  # Only at the first log.
  finally:
    gin.clear_config()
  assert 'rate.value = 2.5' in first
  assert 'rate.value = 0.5' in (tmp_path / 'config.gin').read_text()
  assert (tmp_path / 'config.until_step_6.gin').read_text() == first
  assert len(list(tmp_path.iterdir())) == 2


def test_a_process_without_output_dir_writes_no_config_gin(tmp_path,
                                                           monkeypatch):
  monkeypatch.chdir(tmp_path)
  _train_log(run_state.RunLog(None), trax_history.History(), 1, Writer())
  assert list(tmp_path.iterdir()) == []
