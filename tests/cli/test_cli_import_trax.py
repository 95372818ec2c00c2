"""terraformer-import-trax: Trax checkpoint in, our checkpoint out."""
import os
import sys

import numpy as np
import pytest

from terraformer import config
from terraformer.loading import model as loading_model
from terraformer.cli import import_trax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
import trax_checkpoints as tc  # pylint: disable=g-import-not-at-top,wrong-import-position

VOCAB = 20
HPARAMS = dict(d_model=16, d_ff=32, n_layers=1, n_heads=4, max_len=32,
               dropout=0.0)
GIN = """
terraformer.train.model = @ScalingTransformerLM
ScalingTransformerLM.vocab_size = 20
ScalingTransformerLM.d_model = 16
ScalingTransformerLM.d_ff = 32
ScalingTransformerLM.n_layers = 1
ScalingTransformerLM.n_heads = 4
ScalingTransformerLM.max_len = 32
ScalingTransformerLM.dropout = 0.0
ScalingTransformerLM.ff_sparsity = 4
ScalingTransformerLM.d_lowrank = 4
ScalingTransformerLM.attention_sparsity = 4
ScalingTransformerLM.loss_sparsity = 4
"""


@pytest.fixture(scope='module')
def trax_checkpoint(tmp_path_factory):
  """(Trax eval model with random weights, its checkpoint, our gin file)."""
  root = tmp_path_factory.mktemp('import_trax')
  signature = tc.int_signature((2, 8))
  model = tc.trax_lm('eval', vocab_size=VOCAB, ff_sparsity=(4, 4),
                     attention_sparsity=4, loss_sparsity=4, **HPARAMS)
  tc.random_weights(model, signature, seed=11)
  path = tc.save_with_trax(model, str(root / 'trax'), (signature,), step=42)
  gin_file = root / 'ours.gin'
  gin_file.write_text(GIN)
  return model, path, str(gin_file)


def _run(capsys, *args):
  code = import_trax.main(['terraformer-import-trax', *args])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def test_imports_a_checkpoint_that_eval_and_decode_load(trax_checkpoint,
                                                        tmp_path, capsys):
  trax_model, path, gin_file = trax_checkpoint
  out = tmp_path / 'ours'
  code, stdout, _ = _run(capsys, f'--trax_checkpoint={path}',
                         f'--config_file={gin_file}', f'--output_dir={out}')
  assert code == 0
  assert 'Trax ConfigurableTransformerLM (step 42) into ScalingTransformerLM' \
      in stdout
  # One file with the weights inline, written atomically (as training
  # writes model.pkl.gz), not Trax's model.pkl.gz + model.weights.npy.gz pair.
  assert sorted(os.listdir(out)) == ['model.pkl.gz']
  # Loaded as terraformer-decode / -eval load checkpoints.
  tokens = np.random.RandomState(0).randint(1, VOCAB, (2, 8)).astype(np.int32)
  model, step = loading_model.load_model(config.model_from_config(), str(out),
                                         'eval', tc.int_signature((2, 8)))
  assert step == 42
  np.testing.assert_allclose(np.asarray(model(tokens)),
                             np.asarray(trax_model(tokens)), atol=1e-4)

  # An existing checkpoint is not overwritten.
  code, _, err = _run(capsys, f'--trax_checkpoint={path}',
                      f'--config_file={gin_file}', f'--output_dir={out}')
  assert code == 2 and 'already holds a checkpoint' in err


def test_mismatched_config_is_one_line_naming_the_weight(trax_checkpoint,
                                                         tmp_path, capsys):
  _, path, gin_file = trax_checkpoint
  out = tmp_path / 'ours'
  code, _, err = _run(capsys, f'--trax_checkpoint={path}',
                      f'--config_file={gin_file}',
                      '--config=ScalingTransformerLM.d_lowrank = 8',
                      f'--output_dir={out}')
  assert code == 2
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  # Embedding, positions, LayerNorm (2), FactoredDense (3), 3 x Conv (6),
  # LayerNorm (2): weight 15 (from 0) is the FF controller's m1.
  assert lines[0].startswith('terraformer-import-trax: error: Trax checkpoint')
  assert ('Trax weight 15 of 26, Residual[1]/_SparseFFController/m1: '
          'checkpoint (16, 4) vs expected (16, 8)') in lines[0]
  assert not out.exists()


def test_user_errors(tmp_path, capsys, trax_checkpoint):
  _, path, gin_file = trax_checkpoint
  code, _, err = _run(capsys, f'--trax_checkpoint={tmp_path / "nope"}',
                      f'--config_file={gin_file}', f'--output_dir={tmp_path}')
  assert code == 2 and 'not found' in err
  code, _, err = _run(capsys, f'--trax_checkpoint={path}',
                      f'--output_dir={tmp_path}')
  assert code == 2 and '--config_file is required' in err
  other = tmp_path / 'terraformer.gin'
  other.write_text('terraformer.train.model = @trax.models.TransformerLM\n')
  code, _, err = _run(capsys, f'--trax_checkpoint={path}',
                      f'--config_file={other}',
                      f'--output_dir={tmp_path / "o"}')
  assert code == 2 and 'has no Trax counterpart' in err
