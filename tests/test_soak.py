"""terraformer.soak, bounded: 2 kill -9s of a tiny run, each resume checked."""
import os

import pytest

from terraformer import soak


@pytest.mark.slow
def test_two_kills_resume_exactly(tmp_path, capsys):
  summary, failures = soak.soak(
      str(tmp_path), kills=2, steps=12, checkpoint_every=3, max_delay=2.0,
      seed=0, config_file=os.path.join(soak._GIN_DIR, 'tiny', 'soak.gin'))  # pylint: disable=protected-access
  assert failures == []
  assert summary.startswith('soak: 2 kills (')
  assert ', 2 clean resumes, ' in summary
  assert 'bit-identical to the uninterrupted run, 0 failure(s)' in summary
  kills = [l for l in capsys.readouterr().out.splitlines()
           if l.startswith('kill ')]
  assert len(kills) == 2 and all(l.endswith(': ok') for l in kills)
