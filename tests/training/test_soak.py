"""terraformer.training.soak, bounded: 2 kill -9s of a tiny run, each resume checked."""
import os

from terraformer.checkpoint import store as checkpoints
from terraformer.training import soak


def test_two_kills_resume_exactly_with_random_draws(tmp_path, capsys):
  # RANDOM_DRAWS: sparse layers and dropout draw from the loop's rng at every
  # step and eval (eval_every=1 in soak.gin: every checkpoint is at an eval
  # step), so the final comparison with the run that never resumed fails if a
  # checkpoint holds another rng than the uninterrupted run has there.
  # 60 steps: a run loads its compiled programs from the compilation cache
  # and trains 12 steps in under max_delay, so that a kill could land after
  # the last step and leave nothing to resume.
  summary, failures = soak.soak(
      str(tmp_path), kills=2, steps=60, checkpoint_every=3, max_delay=2.0,
      seed=0, config_file=os.path.join(soak._GIN_DIR, 'tiny', 'soak.gin'),  # pylint: disable=protected-access
      bindings=soak.RANDOM_DRAWS)
  assert failures == []
  assert summary.startswith('soak: 2 kills (')
  assert ', 2 clean resumes, ' in summary
  assert ('bit-identical to the uninterrupted run (never resumed), final eval '
          'line equal, 0 failure(s)') in summary
  out = capsys.readouterr().out.splitlines()
  kills = [l for l in out if l.startswith('kill ')]
  assert len(kills) == 2 and all(l.endswith(': ok') for l in kills)
  reference = [l for l in out if l.startswith('reference: ')]
  assert reference and 'step 60/60 | train loss ' in reference[0]


def test_an_interrupted_save_is_told_from_a_committed_one(tmp_path):
  """`_leftovers`: how the soak tells a kill mid-save (a checkpoint folder
  without its commit marker, or a temporary file) from a clean one."""
  folder = tmp_path / checkpoints.CHECKPOINTS
  assert not soak._leftovers(str(tmp_path))  # pylint: disable=protected-access
  (folder / '3').mkdir(parents=True)
  (folder / '3' / checkpoints.MARKER).write_text('')
  assert not soak._leftovers(str(tmp_path))  # pylint: disable=protected-access
  (folder / '6').mkdir()
  assert soak._leftovers(str(tmp_path))  # pylint: disable=protected-access
  (folder / '6' / checkpoints.MARKER).write_text('')
  (tmp_path / 'model.pkl.gz.tmp-1').write_text('')
  assert soak._leftovers(str(tmp_path))  # pylint: disable=protected-access
