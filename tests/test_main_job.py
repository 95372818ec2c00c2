"""scripts/main.sh end to end with one step per stage: by default train body
-> abstract, ROUGE on test papers, decode speed, then a rerun that
resumes/skips every stage; with STAGES naming it, masked-word pretraining
first and the training from its checkpoint."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One step (its checkpoint, its evaluation), one layer each side, short
# sequences (the LSH chunks of 64 divide the inputs, 128, and inputs +
# targets, 128 + 64; so the decoded length stays TARGET_LEN).
STEPS = 1
TINY = [f'--config=terraformer.train.steps = {STEPS}',
        '--config=terraformer.train.eval_every = 1',
        '--config=terraformer.train.eval_batches = 1',
        '--config=Terraformer.n_encoder_layers = 1',
        '--config=Terraformer.n_decoder_layers = 1',
        '--config=INPUT_LEN = 128', '--config=TARGET_LEN = 64',
        '--config=terraformer.evaluate.max_examples = 2',
        '--config=terraformer.evaluate.batch_size = 2']


ROUGE = ('rouge1', 'rouge2', 'rougeLsum', 'rougeL')


def _table_rows(out):
  """{row label: its 4 ROUGE F1s} of terraformer-eval's table."""
  rows = {}
  for label, numbers in re.findall(
      r'^(model|lead-3|lead-k matched|random 3)\b.*?((?: +\d+\.\d\d){4})',
      out, re.M):
    rows[label] = [float(x) for x in numbers.split()]
  return rows


def _main_sh(output_dir, *args, stages=None):
  # The benchmark's models with 1 decoder block instead of 4 (the binding
  # applies to both; no spaces: main.sh splits BENCH_ARGS on them).
  env = dict(os.environ, OUTPUT_DIR=str(output_dir),
             BENCH_ARGS=('--tokens=2 --repeats=1 '
                         '--config=ScalingTransformer.n_decoder_layers=1'))
  if stages:
    env['STAGES'] = stages
  result = subprocess.run(['bash', os.path.join(ROOT, 'scripts', 'main.sh'),
                           *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=2400, check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return result.stdout


def test_main_job_end_to_end(tmp_path):
  out = _main_sh(tmp_path, *TINY)
  assert 'stage 1/4' not in out  # No pretraining by default.
  for n in ('2/4', '3/4', '4/4'):
    assert f'stage {n}' in out
  fine = tmp_path / 'finetune'
  assert not (tmp_path / 'pretrain').exists()
  assert (fine / 'model.pkl.gz').is_file()
  # Body -> abstract from scratch, the vocabulary size of the pretraining.
  config = (fine / 'config.gin').read_text()
  assert "summarization_stream.source = 'aclsum'" in config
  assert 'MODEL_VOCAB_SIZE = 2148' in config
  assert 'Fine-tuning from' not in out
  # ROUGE on 2 test papers beside the extractive baselines on the same
  # papers, and one generated summary.
  assert f"2 examples of split 'test', checkpoint step {STEPS}" in out
  assert re.search(r'F1 \(%\) +ROUGE-1 +ROUGE-2 +ROUGE-LSum +ROUGE-L', out)
  rows = _table_rows(out)
  assert list(rows) == ['model', 'lead-3', 'lead-k matched', 'random 3']
  summary = json.loads((fine / f'eval_test_step{STEPS}.json').read_text())
  assert set(summary['baselines']) == {'lead_3', 'lead_matched', 'random_3'}
  assert rows['model'] == [round(100 * summary[k], 2) for k in ROUGE]
  assert rows['lead-3'] == [round(100 * summary['baselines']['lead_3'][k], 2)
                            for k in ROUGE]
  assert 'generated: ' in out and 'reference: ' in out
  # Dense vs sparse decode speed.
  assert re.search(r'bench_dense +\d+\.\d', out)
  assert re.search(r'bench_sparse +\d+\.\d.* \d+\.\d\dx', out)
  assert (tmp_path / 'bench.txt').is_file()

  # Rerun: training is done, eval and bench outputs are reused.
  again = _main_sh(tmp_path, *TINY)
  assert again.count(f'Already trained for {STEPS} >= {STEPS} steps.') == 1
  assert '(up to date:' in again and '(done before:' in again
  assert list(_table_rows(again)) == list(rows)

  # The paper's recipe: masked words from the paper bodies (vocab + 100
  # sentinels), then the training from that checkpoint.
  recipe = tmp_path / 'recipe'
  out = _main_sh(recipe, *TINY, stages='pretrain finetune')
  assert 'stage 1/4' in out and 'stage 2/4' in out and 'stage 3/4' not in out
  pre = recipe / 'pretrain'
  config = (pre / 'config.gin').read_text()
  assert "train/c4_stream.source = 'aclsum'" in config
  assert 'Terraformer.input_vocab_size = %MODEL_VOCAB_SIZE' in config
  assert f'Fine-tuning from {pre}' in out
  assert (recipe / 'finetune' / 'model.pkl.gz').is_file()
