"""terraformer-ood: errors, and a tiny end-to-end table that resumes."""
import glob
import json
import os

from terraformer import config
from terraformer.evaluation import ood
from terraformer.cli import ood as ood_cli

# Shrinks the repository's cells to seconds: tiny lengths, model and steps.
TINY = [
    'arithmetic_stream.train_max_digits = 3',
    'arithmetic_stream.eval_min_digits = 6',
    'arithmetic_stream.eval_max_digits = 7',
    'arithmetic_stream.batch_size = 4',
    'ScalingTransformer.d_model = 16',
    'ScalingTransformer.d_ff = 32',
    'ScalingTransformer.n_encoder_layers = 1',
    'ScalingTransformer.n_decoder_layers = 1',
    'ScalingTransformer.n_heads = 2',
    'ScalingTransformer.max_len = 64',
    'Terraformer.d_model = 16',
    'Terraformer.d_ff = 32',
    'Terraformer.n_encoder_layers = 1',
    'Terraformer.n_decoder_layers = 1',
    'Terraformer.n_heads = 2',
    'Terraformer.max_len = 64',
    'Terraformer.predict_mem_len = 64',
    'Terraformer.predict_drop_len = 32',
    # Full attention, plain residuals: the cells' LSH reversible Terraformer
    # compiles for minutes on a loaded CPU (the harness is under test here).
    "Terraformer.encoder_attention_type = 'full'",
    "Terraformer.decoder_attention_type = 'full'",
    'Terraformer.reversible = False',
    'arithmetic_stream.pad_to_multiple = 1',
    'Terraformer.d_sru = 8',
    # One step, and one more when a run resumes below: the checks need
    # finished, resumed and skipped runs, not trained models.
    'terraformer.train.steps = 1',
    'terraformer.train.eval_every = 1',
    'terraformer.train.eval_batches = 1',
    'evaluate_cell.n_examples = 6',
    'evaluate_cell.batch_size = 4',
]


def _run(capsys, *args):
  code = ood_cli.main(['terraformer-ood', *args])
  out, err = capsys.readouterr()
  return code, out, err


def _assert_one_line_error(err, *parts):
  lines = err.splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith('terraformer-ood: error: ')
  for part in parts:
    assert part in lines[0]


def test_errors(tmp_path, capsys):
  out_dir = tmp_path / 'out'
  code, _, err = _run(capsys, '--output_dir=' + str(out_dir),
                      '--cells=copy_nothing')
  assert code == 2
  _assert_one_line_error(err, "no gin file for cell 'copy_nothing'")
  code, _, err = _run(capsys, '--cells=copy_transformer')
  assert code == 2
  _assert_one_line_error(err, 'output_dir')
  code, _, err = _run(capsys, '--output_dir=' + str(out_dir),
                      '--cells=copy_transformer',
                      '--config=arithmetic_stream.train_max_digits = 40',
                      '--config=arithmetic_stream.eval_min_digits = 60',
                      '--config=arithmetic_stream.eval_max_digits = 70')
  assert code == 2
  _assert_one_line_error(err, 'cell copy_transformer', 'out of distribution',
                         'eval_min_digits=60', 'train_max_digits=40')
  assert not out_dir.exists() or not os.listdir(out_dir)


def test_every_cell_config_parses():
  """Each default cell names a gin file that the runner can configure."""
  import gin
  from terraformer.cli import common
  common.setup()
  for cell in ood.DEFAULT_CELLS:
    _, path = ood.cell_config_file(cell, config.GIN_DIR)
    for extra in ([], [os.path.join(config.GIN_DIR, 'ood',
                                    'paper_scale.gin')]):
      config.parse_gin([path] + extra, [])
      task = gin.query_parameter('terraformer.data.arithmetic_stream.task')
      assert cell.startswith(task + '_')
      assert gin.query_parameter('terraformer.train.model') is not None
  gin.clear_config()


def test_tiny_table_end_to_end_then_skip(tmp_path, capsys):
  out_dir = tmp_path / 'out'
  args = ['--output_dir=' + str(out_dir),
          '--cells=copy_transformer,add_terraformer_sru', '--seeds=3'] + [
              '--config=' + b for b in TINY]
  code, out, err = _run(capsys, *args)
  assert code == 0, err
  assert ('| Model | copy | copy (seq) | add | add (seq) | copy in-dist. | '
          'add in-dist. |') in out
  assert '| Transformer |' in out and '| Terraformer (low-rank SRU) |' in out
  table = json.loads((out_dir / ood.TABLE_JSON).read_text())
  assert [r['cell'] for r in table] == ['copy_transformer',
                                        'add_terraformer_sru']
  for r in table:
    assert r['steps'] == 1 and r['parameters'] > 0
    assert r['settings']['train_digits'] == [1, 3]
    assert r['settings']['eval_digits'] == [6, 7]
    assert r['settings']['seed'] == 3
    for split in ('validation', 'ood'):
      score = r['scores'][split]
      assert score['n_sequences'] == 6
      assert 0 <= score['correct_tokens'] <= score['total_tokens']
    cell_dir = out_dir / (r['cell'] + '_seed3')
    assert (cell_dir / 'model.pkl.gz').exists()
    assert glob.glob(str(cell_dir / 'train' / 'events.out.tfevents.*'))
    assert glob.glob(str(cell_dir / 'eval' / 'events.out.tfevents.*'))
  assert (out_dir / ood.TABLE_MD).read_text().strip() in out
  # Rerun: both cells are skipped, the same table comes back.
  code, out2, err = _run(capsys, *args)
  assert code == 0, err
  assert out2.count('done before') == 2 and 'training in' not in out2
  assert json.loads((out_dir / ood.TABLE_JSON).read_text()) == table
  # More steps and a second seed: seed 3 resumes from its checkpoint and is
  # re-evaluated, seed 4 trains; the table pools the two.
  code, out3, err = _run(capsys, args[0], '--cells=copy_transformer',
                         '--seeds=3,4', *['--config=' + b for b in TINY],
                         '--config=terraformer.train.steps = 2')
  assert code == 0, err
  assert 'Resuming from checkpoint at step 1' in out3
  table3 = json.loads((out_dir / ood.TABLE_JSON).read_text())
  assert [(r['steps'], r['settings']['seed']) for r in table3] == [(2, 3),
                                                                  (2, 4)]
  assert (out_dir / 'copy_transformer_seed4' / 'model.pkl.gz').exists()
  row = next(line for line in out3.splitlines()
             if line.startswith('| Transformer |'))
  pooled = [100 * r['scores']['ood']['token_accuracy'] for r in table3]
  assert f'({pooled[0]:.1f}, {pooled[1]:.1f})' in row
  # --table_only: the finished runs' table, nothing trained, the missing run
  # named.
  code, out4, err = _run(capsys, args[0],
                         '--cells=copy_transformer,add_terraformer_sru',
                         '--seeds=3,4', '--table_only')
  assert code == 0, err
  assert '[add_terraformer_sru_seed4] no result yet' in out4
  assert 'training in' not in out4 and 'done before' not in out4
  assert [(r['cell'], r['settings']['seed']) for r in json.loads(
      (out_dir / ood.TABLE_JSON).read_text())] == [
          ('copy_transformer', 3), ('copy_transformer', 4),
          ('add_terraformer_sru', 3)]
  row4 = next(line for line in out4.splitlines()
              if line.startswith('| Transformer |'))
  assert f'({pooled[0]:.1f}, {pooled[1]:.1f})' in row4


def test_bad_seeds(tmp_path, capsys):
  code, _, err = _run(capsys, '--output_dir=' + str(tmp_path / 'out'),
                      '--cells=copy_transformer', '--seeds=0,x')
  assert code == 2
  _assert_one_line_error(err, '--seeds must be integers')
  code, _, err = _run(capsys, '--output_dir=' + str(tmp_path / 'out'),
                      '--cells=copy_transformer', '--seeds=1,1')
  assert code == 2
  _assert_one_line_error(err, 'seeds must be distinct integers')
