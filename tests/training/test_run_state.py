"""The rules both loops share (terraformer/training/run_state.py): a step's
checkpoints after its evals. The loops using them:
tests/training/test_loop.py (both loops' config.gin, resume, NaN guard),
tests/training/test_resume_sweep*.py (exact resume at a step that both
evaluates and checkpoints)."""
from terraformer.training import run_state


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
