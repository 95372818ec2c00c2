"""python -m terraformer.cli.extraction_eval: a run scored (a checkpoint of
random weights in the scorer ablation's gin setting, shrunk) and the table."""
import contextlib
import io
import json
import os

import gin
import jax
import numpy as np
import pytest
from trax import shapes

from terraformer import config
from terraformer.cli import extraction_eval
from terraformer.trax_bridge import checkpoint_import

GIN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'gin', 'long_input', 'scorers', 'base.gin')
# 32 tokens in sections of 16, 2 salient tokens, d 16, pooled 32 -> 8 after
# layer 0 (one layer after it), one decoder layer.
TINY = ['INPUT_LEN = 32', 'N_SALIENT = 2',
        'salient_extraction_stream.declare_every = 16',
        'salient_extraction_stream.batch_size = 2',
        'ScalingTransformer.d_model = 16', 'ScalingTransformer.d_ff = 32',
        'ScalingTransformer.n_heads = 2', 'ScalingTransformer.max_len = 32',
        'ScalingTransformer.n_encoder_layers = 2',
        'ScalingTransformer.n_decoder_layers = 1',
        'ScalingTransformer.encoder_pooling = {0: 8}']


def _checkpoint(folder, bindings):
  """A checkpoint (step 7) of the configured model's random weights."""
  config.parse_gin([GIN], bindings)
  model = config.model_from_config()(mode='eval')
  model.init((shapes.ShapeDtype((2, 32), np.int32),
              shapes.ShapeDtype((2, 3), np.int32)), rng=jax.random.PRNGKey(0))
  gin.clear_config()
  checkpoint_import.write_checkpoint(model.weights, str(folder), step=7)


def _run(*args):
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    code = extraction_eval.main(['extraction-eval', *args])
  return code, out.getvalue()


@pytest.mark.parametrize('scorer,pooled', [('linear', True), ('mean', False)])
def test_a_run_is_scored_on_the_split_asked_for(tmp_path, scorer, pooled):
  bindings = TINY + [f"ScalingTransformer.pooling_scorer = '{scorer}'"]
  _checkpoint(tmp_path, bindings)
  code, out = _run(f'--config_file={GIN}', f'--output_dir={tmp_path}',
                   '--split=test', '--batches=2',
                   *[f'--config={b}' for b in bindings])
  assert code == 0
  result = json.loads(out)
  assert (result['split'], result['step'], result['examples']) == ('test', 7, 4)
  assert 0.0 <= result['token_f1'] <= 1.0
  assert 0.0 <= result['exact_match'] <= 1.0
  if pooled:  # Recall over the 2 salient positions of 4 examples each.
    assert (8 * result['recall_salient']).is_integer()
    assert result['recall_salient'] <= result['recall_salient_or_marker']
  else:       # Windows select nothing.
    assert result['recall_salient'] is None


def test_a_stream_of_another_task_is_refused(tmp_path, capsys):
  code, _ = _run(f'--config_file={GIN}', f'--output_dir={tmp_path}',
                 "--config=terraformer.train.eval_stream = @lm_stream")
  assert code == 2
  assert 'not salient_extraction_stream' in capsys.readouterr().err


def test_table_of_rows_and_bad_rows(tmp_path, capsys):
  run = tmp_path / 'run'
  run.mkdir()
  for split in ('validation', 'test'):
    (run / f'eval_{split}_100.json').write_text(json.dumps(dict(
        token_f1=0.5, exact_match=0.25, recall_salient=None,
        recall_salient_or_marker=None)))
  code, out = _run(f'--row=full|-|512|{run}')
  assert code == 0
  assert json.loads(out)['rows'] == [
      ['full', '0.500', '0.250', '-', '-', '-', '-', '100']]
  assert _run('--row=full|512|x')[0] == 2
  assert 'LABEL|MODEL|LEN' in capsys.readouterr().err
