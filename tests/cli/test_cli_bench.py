"""terraformer-bench: one model per --config_file, errors, JSON, sweep."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from terraformer.cli import bench as bench_cli
from terraformer.cli import bench_format

from bench_models import LM_GIN, SPARSE_GIN  # tests/bench_models.py

HERE = os.path.dirname(os.path.abspath(__file__))


def _configs(tmp_path):
  dense = tmp_path / 'dense.gin'
  dense.write_text(LM_GIN)
  sparse = tmp_path / 'sparse.gin'    # composed with dense.gin via '+'
  sparse.write_text(SPARSE_GIN)
  return str(dense), str(sparse)


def _run(capsys, *args):
  code = bench_cli.main(['terraformer-bench', *args])
  out, err = capsys.readouterr()
  return code, out, err


def _one_line_error(err, *parts):
  lines = [l for l in err.splitlines() if l.startswith('terraformer-bench')]
  assert len(lines) == 1, err
  assert lines[0].startswith('terraformer-bench: error: ')
  for part in parts:
    assert part in lines[0], lines[0]
  assert 'Traceback' not in err


def test_split_config_files():
  argv = ['prog', '--config_file=a.gin', '--tokens=3', '--config_file',
          'b.gin+c.gin', '--config=X.y = 1']
  rest, models = bench_cli.split_config_files(argv)
  assert rest == ['prog', '--tokens=3', '--config=X.y = 1']
  assert models == [['a.gin'], ['b.gin', 'c.gin']]
  taken = set()
  assert [bench_cli.model_name(m, taken) for m in
          (['x/a.gin'], ['b.gin', 'c.gin'], ['y/a.gin'])] == [
              'a', 'b+c', 'a#2']


@pytest.mark.parametrize('args, parts', [
    (['--config_file=nope.gin'], ["config file 'nope.gin' not found"]),
    (['--config_file={dense}+nope.gin'], ["'nope.gin' not found"]),
    ([], ['at least one --config_file']),
    (['--config_file={dense}', '--config=NoSuch.x = 1'], ['bad gin config',
                                                          'NoSuch']),
    (['--config_file={dense}', '--json={tmp}/no/such/dir/r.json'],
     ['--json', 'does not exist']),
    (['--config_file={dense}', '--sweep'], ['--sweep needs two or more']),
    (['--config_file={dense}', '--config_file={dense}', '--sweep',
      '--sweep_d_models=32,big'], ['--sweep_d_models']),
    (['--config_file={dense}', '--tokens=0'], ['tokens']),
    (['--config_file={sparse}'], ['no model configured']),
    (['--config_file={dense}', '--agreement'],
     ['--agreement needs two or more']),
    (['--config_file={dense}', '--config_file={dense}', '--agreement',
      "--config=bench_weights.created = 'stored'"],
     ['--agreement: dense', "bench_weights.created = 'stored'"]),
    (['--config_file={dense}', "--config=bench_weights.created = 'int4'"],
     ['bench_weights.created must be one of']),
    (['--config_file={dense}', '--config_file={dense}', '--agreement',
      '--config=bench_weights.noise = -1'], ['bench_weights.noise must be']),
    (['--config_file={dense}', '--checkpoint={tmp}'],
     ['--checkpoint goes with --agreement or --quality']),
    (['--config_file={dense}', '--config_file={dense}', '--quality',
      '--prompt_file={tmp}/p.txt'], ['--prompt_file goes with --agreement']),
    (['--config_file={dense}', '--quality'], ['--quality needs two or more']),
    (['--config_file={dense}', '--config_file={dense}', '--quality'],
     ['--quality: the config binds no input_len / target_len']),
    (['--config_file={dense}', '--variants=ffi,gpu'],
     ["--variants: 'gpu' is not KERNELS[:WEIGHTS]"]),
    (['--config_file={dense}', '--variants=ffi:int4'], ["'ffi:int4'"]),
    (['--config_file={dense}', '--config_file={dense}', '--agreement',
      '--tokens=200'],
     ['dense: --prompt_len=16 and --tokens=200 need 216 positions, the model '
      'has 128']),
    (['--config_file={dense}', '--config_file={dense}', '--agreement',
      '--checkpoint={tmp}/none'], ['no checkpoint model.pkl.gz in']),
])
def test_errors(tmp_path, capsys, args, parts):
  dense, sparse = _configs(tmp_path)
  args = [a.format(dense=dense, sparse=sparse, tmp=tmp_path) for a in args]
  code, out, err = _run(capsys, *args)
  assert code == 2
  assert out == ''
  _one_line_error(err, *parts)


def test_help(capsys):
  code, out, _ = _run(capsys, '--help')
  assert code == 0
  assert 'compare_trax' in out and 'sweep_d_models' in out
  assert 'EACH --config_file is one model' in out


def test_agreement_table_and_json(tmp_path, capsys):
  dense, sparse = _configs(tmp_path)
  bf16 = tmp_path / 'bf16.gin'
  bf16.write_text("decode_options.kernels = 'ffi'\n"
                  "decode_options.weights = 'bfloat16'\n")
  path = tmp_path / 'agreement.json'
  code, out, err = _run(capsys, '--agreement',
                        f'--config_file={dense}+{sparse}',
                        f'--config_file={dense}+{sparse}+{bf16}',
                        '--tokens=4', '--prompt_len=3', f'--json={path}')
  assert code == 0, err
  rows = out.splitlines()
  assert rows[0].split()[:3] == ['model', 'decode', 'path']
  assert rows[2].split()[0] == 'dense+sparse+bf16'
  report = json.loads(path.read_text())
  models = report['models']
  assert [r['max_abs_logit_delta'] == 0 for r in models] == [True, False]
  assert 'bfloat16' in models[1]['decode_path']
  # The JSON holds the table printed.
  table = report['tables']['agreement']
  assert table == bench_format.agreement_table(models)
  assert rows[:3] == bench_format.common.format_aligned(table).splitlines()


def test_table_and_json(tmp_path, capsys):
  dense, sparse = _configs(tmp_path)
  path = tmp_path / 'bench.json'
  code, out, err = _run(capsys, f'--config_file={dense}',
                        f'--config_file={dense}+{sparse}', '--tokens=2',
                        '--prompt_len=3', '--repeats=2', f'--json={path}')
  assert code == 0, err
  rows = out.splitlines()
  assert rows[0].split()[0] == 'model'
  assert [r.split()[0] for r in rows[1:3]] == ['dense', 'dense+sparse']
  report = json.loads(path.read_text())
  models = report['models']
  assert [m['name'] for m in models] == ['dense', 'dense+sparse']
  # The JSON holds the tables printed: speed (the first lines) and memory.
  speed = report['tables']['speed']
  assert speed == bench_format.speed_table(report)
  assert rows[:3] == bench_format.common.format_aligned(speed).splitlines()
  assert report['tables']['memory'] == bench_format.memory_table(report)
  for m in models:
    for key in ('ms_per_token', 'ms_per_block', 'bytes_per_token',
                'bound_ms_per_token'):
      assert m[key] > 0 or key == 'ms_per_block', (key, m[key])
    # The bound reads the bytes at the bandwidth probed after each round of
    # this model's repeats (their median), not the run's first probe.
    assert len(m['bandwidth_gbps_rounds']) == 2
    assert m['bandwidth_gbps'] == pytest.approx(
        np.median(m['bandwidth_gbps_rounds']))
    assert m['bytes_bound_ms_per_token'] == pytest.approx(
        1e3 * m['bytes_per_token'] / (m['bandwidth_gbps'] * 1e9))
    # The compute bound: the step's multiply-adds at the peaks probed after
    # each round (their median); the bound, the larger of the two.
    peaks = m['peak_macs']
    assert m['compute_bound_ms_per_token'] == pytest.approx(
        1e3 * (m['macs_per_token']['int8'] / peaks['int8']
               + m['macs_per_token']['float'] / peaks['float32']))
    assert m['macs_per_token']['float'] > 0
    assert m['bound_ms_per_token'] == max(m['bytes_bound_ms_per_token'],
                                          m['compute_bound_ms_per_token'])
    # The table shows the same numbers.
    row = rows[1 + models.index(m)].split()
    assert float(row[1]) == pytest.approx(m['ms_per_token'], abs=0.051)
    assert float(row[4]) == pytest.approx(m['bytes_per_token'] / 1e6,
                                          abs=0.051)
  assert models[1]['bytes_per_token'] < models[0]['bytes_per_token']
  assert report['settings']['tokens'] == 2
  # Memory held per model (weights by layer kind, caches) and peak RSS.
  for m in models:
    held = sum(m['memory_by_kind'].values())
    assert held >= sum(v for k, v in m['memory_by_kind'].items()
                       if k != 'state (caches)') > 0
  assert [r.split(':')[0] for r in rows if r.startswith('memory ')] == [
      'memory dense', 'memory dense+sparse']
  assert report['peak_rss_bytes'] > held
  assert f"{report['peak_rss_bytes'] / 2**30:.2f} GiB" in rows[-2]
  # The machine: the table's last line, the JSON's `machine`.
  assert rows[-1] == bench_format.format_machine(report['machine'])
  assert report['machine']['cpu_model'] in rows[-1]
  # Both models against the dense one (same decode options, same d_model):
  # measured, and at the dense model's bound.
  dense = models[0]
  assert [m['dense_baseline'] for m in models] == ['dense', 'dense']
  for m, row in zip(models, rows[1:3]):
    assert m['speedup_vs_dense'] == pytest.approx(
        dense['ms_per_token'] / m['ms_per_token'])
    assert m['speedup_vs_dense_bound'] == pytest.approx(
        dense['bound_ms_per_token'] / m['ms_per_token'])
    cells = row.split()
    assert cells[11:13] == [f"{m['speedup_vs_dense']:.2f}x",
                            f"{m['speedup_vs_dense_bound']:.2f}x"]
  assert models[0]['speedup_vs_dense'] == 1.0


# The tiny sparse LM of the decode CLI tests (FF, QKV and loss sparse,
# 2048-piece vocab), with room for an 8-token prompt and 64 tokens, trained
# enough that its logits' top-2 gaps are far above float32 rounding.
TRAINED_STEPS = 200
VARIANTS = ('xla', 'ffi', 'ffi:bfloat16', 'ffi:int8', 'ffi:q8')


@pytest.fixture(scope='module')
def trained_lm(tmp_path_factory):
  """(run, checkpoint dir) of the tiny LM trained by terraformer-train."""
  import gin  # pylint: disable=g-import-not-at-top
  import tiny_checkpoints  # pylint: disable=g-import-not-at-top
  gin_file, bindings = tiny_checkpoints.LM
  run = (gin_file, bindings + ['ScalingTransformerLM.max_len = 128',
                               'multifactor.warmup_steps = 20'])
  out_dir = tmp_path_factory.mktemp('bench_lm') / 'ckpt'
  tiny_checkpoints.train(run, out_dir, steps=TRAINED_STEPS)
  gin.clear_config()
  return run, str(out_dir)


def _greedy_decode_of_checkpoint(run, checkpoint, prompt, tokens,
                                 encdec=False):
  """What terraformer-decode's loading and greedy search decode (an
  encoder-decoder: from `prompt` as its input)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trax import shapes  # pylint: disable=g-import-not-at-top
  from terraformer import config  # pylint: disable=g-import-not-at-top
  from terraformer.decoding import search  # pylint: disable=g-import-not-at-top
  from terraformer.loading import model as loading_model  # pylint: disable=g-import-not-at-top
  import tiny_checkpoints  # pylint: disable=g-import-not-at-top
  config.parse_gin(*tiny_checkpoints.config_args_split(run))
  token = shapes.ShapeDtype((1, 1), np.int32)
  signature = ((shapes.ShapeDtype((1, len(prompt)), np.int32), token)
               if encdec else token)
  model, step = loading_model.load_model(
      config.model_from_config(), checkpoint, 'predict', signature)
  assert encdec or step == TRAINED_STEPS
  return search.decode(model, np.asarray([prompt], np.int32),
                       max_length=tokens, eos_id=None,
                       input_length=len(prompt) if encdec else None,
                       progress=False)[0].tolist()


def test_agreement_of_every_variant_on_a_trained_checkpoint(
    trained_lm, tmp_path, capsys):
  """--checkpoint: every variant decodes the checkpoint's weights; float32
  kernels agree with XLA to rounding, the 8/16-bit storages differ a
  little, and no row contradicts its own numbers."""
  import tiny_checkpoints  # pylint: disable=g-import-not-at-top
  run, checkpoint = trained_lm
  path = tmp_path / 'agreement.json'
  code, out, err = _run(capsys, '--agreement', f'--checkpoint={checkpoint}',
                        f"--variants={','.join(VARIANTS)}",
                        *tiny_checkpoints.config_args(run), '--tokens=64',
                        '--prompt_len=8', f'--json={path}')
  assert code == 0, err
  report = json.loads(path.read_text())['models']
  assert [r['name'] for r in report] == [
      'lm_sparse+' + v.replace(':', '_') for v in VARIANTS]
  reference = report[0]
  assert reference['checkpoint'] == checkpoint
  assert reference['checkpoint_step'] == TRAINED_STEPS
  # The reference decodes what terraformer-decode's loading and greedy
  # search decode from the checkpoint (not random weights).
  assert reference['greedy_tokens'] == _greedy_decode_of_checkpoint(
      run, checkpoint, reference['prompt_ids'], 64)
  margin = reference['min_top2_margin']
  for r in report:
    assert r['tokens'] == len(r['greedy_tokens']) == 64
    assert r['prompt_ids'] == reference['prompt_ids']
    same = [a == b for a, b in zip(r['greedy_tokens'],
                                   reference['greedy_tokens'])]
    assert r['greedy_agreement'] == sum(same) / 64
    assert r['first_difference'] == (None if all(same)
                                     else same.index(False))
    if r['max_abs_logit_delta'] < margin / 2:  # No argmax can change.
      assert r['greedy_agreement'] == 1.0, r
  by_variant = dict(zip(VARIANTS, report))
  assert by_variant['xla']['max_abs_logit_delta'] == 0
  ffi = by_variant['ffi']
  assert ffi['max_abs_logit_delta'] <= 1e-4 * reference['max_abs_logit']
  assert ffi['greedy_agreement'] == 1.0
  for storage in ('bfloat16', 'int8', 'q8'):
    r = by_variant[f'ffi:{storage}']
    assert f'{storage} weights' in r['decode_path']
    assert 0 < r['max_abs_logit_delta'] < 0.2 * reference['max_abs_logit']
  rows = out.splitlines()
  assert rows[0].split()[-2:] == ['first', 'difference']
  assert f'the weights of {checkpoint} (step {TRAINED_STEPS})' in rows[6]
  assert 'teacher-forced' in rows[6]
  assert rows[-1] == bench_format.format_machine(
      json.loads(path.read_text())['machine'])


def test_agreement_of_an_encoder_decoder_from_its_first_target_token(
    encdec_checkpoint, tmp_path, capsys):
  """An encoder-decoder's rows start at the first target position (its
  first step reads the prompt): the reference's greedy tokens are
  terraformer-decode's greedy search of the checkpoint, token for token."""
  import tiny_checkpoints  # pylint: disable=g-import-not-at-top
  run, checkpoint, _ = encdec_checkpoint
  path = tmp_path / 'agreement.json'
  code, _, err = _run(capsys, '--agreement', f'--checkpoint={checkpoint}',
                      '--variants=xla,ffi:q8',
                      *tiny_checkpoints.config_args(run), '--tokens=8',
                      '--prompt_len=16', f'--json={path}')
  assert code == 0, err
  reference, q8 = json.loads(path.read_text())['models']
  assert len(reference['greedy_tokens']) == 8
  assert reference['greedy_tokens'] == _greedy_decode_of_checkpoint(
      run, checkpoint, reference['prompt_ids'], 8, encdec=True)
  assert q8['prompt_ids'] == reference['prompt_ids']


def test_agreement_sees_noisy_weights_and_reads_a_prompt_file(
    trained_lm, tmp_path, capsys):
  """The check has power: the checkpoint with noise on its weights
  (bench_weights.noise) departs from the greedy tokens and moves logits by
  more than the reference's top-2 gap; --prompt_file tokenizes real text."""
  import gin  # pylint: disable=g-import-not-at-top
  from terraformer.cli import common  # pylint: disable=g-import-not-at-top
  from terraformer.loading import vocab as loading_vocab  # pylint: disable=g-import-not-at-top
  import tiny_checkpoints  # pylint: disable=g-import-not-at-top
  run, checkpoint = trained_lm
  gin_file, bindings = run
  noisy = tmp_path / 'noisy.gin'
  noisy.write_text('bench_weights.noise = 0.5\n')
  text = ('Sparse layers decode faster than dense ones because each token '
          'reads only a few rows of every weight matrix.')
  prompt = tmp_path / 'prompt.txt'
  prompt.write_text(text)
  path = tmp_path / 'agreement.json'
  code, out, err = _run(
      capsys, '--agreement', f'--checkpoint={checkpoint}',
      f'--prompt_file={prompt}', f'--config_file={gin_file}',
      f'--config_file={gin_file}+{noisy}',
      *[f'--config={b}' for b in bindings], '--tokens=64', '--prompt_len=8',
      f'--json={path}')
  assert code == 0, err
  reference, noise = json.loads(path.read_text())['models']
  assert (reference['noise'], noise['noise']) == (0, 0.5)
  assert noise['greedy_agreement'] < 1
  assert noise['first_difference'] is not None
  assert noise['max_abs_logit_delta'] > reference['min_top2_margin'] / 2
  assert 'weights with noise (x RMS, bench_weights.noise): ' in out
  # The prompt: the file's first 8 tokens in the config's vocab.
  config_files, config_bindings = tiny_checkpoints.config_args_split(run)
  common.setup()
  gin.clear_config()
  from terraformer import config  # pylint: disable=g-import-not-at-top
  config.parse_gin(config_files, config_bindings)
  vocab = loading_vocab.text_vocab()
  assert reference['prompt_ids'] == list(vocab.encode(text))[:8]
  assert reference['prompt'] == str(prompt)
  # A checkpoint of another config is one error line.
  dense, _ = _configs(tmp_path)
  code, out, err = _run(capsys, '--agreement', f'--checkpoint={checkpoint}',
                        f'--config_file={dense}', f'--config_file={dense}')
  assert code == 2
  _one_line_error(err, 'was it trained with this config?')


def test_quality_is_the_training_eval_and_sees_noise(encdec_checkpoint,
                                                     tmp_path, capsys):
  """--quality's XLA float32 log-perplexity is the one terraformer-train's
  eval printed for the same validation batch (Trax's training-mode model,
  an oracle independent of the decode step); float32 kernels agree with it,
  Q8 weights move it a little and noisy weights a lot."""
  from terraformer.data import aclsum_papers  # pylint: disable=g-import-not-at-top
  from terraformer.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  import tiny_checkpoints  # pylint: disable=g-import-not-at-top
  run, checkpoint, train_stdout = encdec_checkpoint
  gin_file, bindings = run
  noisy = tmp_path / 'noisy.gin'
  noisy.write_text('bench_weights.noise = 0.5\n')
  path = tmp_path / 'quality.json'
  code, out, err = _run(
      capsys, '--quality', f'--checkpoint={checkpoint}',
      '--variants=xla,ffi,ffi:q8', f'--config_file={gin_file}',
      f'--config_file={gin_file}+{noisy}',
      *[f'--config={b}' for b in bindings], '--split=validation',
      '--max_examples=2', f'--json={path}')
  assert code == 0, err
  report = json.loads(path.read_text())['models']
  assert [r['name'] for r in report] == [
      f'encdec_sparse{n}+{v}' for n in ('', '+noisy')
      for v in ('xla', 'ffi', 'ffi_q8')]
  xla, ffi, q8, noisy_xla = report[:4]
  assert xla['log_perplexity'] == pytest.approx(
      tiny_checkpoints.last_eval_log_perplexity(train_stdout), abs=1e-3)
  # Every target position of both papers: the abstract's pieces + EOS, cut
  # to the target length.
  vocab = vocab_lib.get_vocab(2048)
  papers = aclsum_papers.load_split('validation')[:2]
  assert xla['positions'] == sum(
      min(len(vocab.encode(p['abstract'].strip())) + 1,
          tiny_checkpoints.TARGET_LEN) for p in papers)
  assert (xla['examples'], xla['input_len']) == (
      2, tiny_checkpoints.INPUT_LEN)
  assert (xla['mean_kl'], xla['same_top_token'],
          xla['max_abs_logit_delta']) == (0, 1, 0)
  assert ffi['mean_kl'] < 1e-6
  assert abs(ffi['log_perplexity_delta']) < 1e-4
  assert 'q8 weights' in q8['decode_path']
  assert 0 < q8['mean_kl'] < noisy_xla['mean_kl'] / 100
  assert noisy_xla['same_top_token'] < 1
  assert abs(noisy_xla['log_perplexity_delta']) > 100 * abs(
      q8['log_perplexity_delta'])
  for r in report:
    assert r['log_perplexity_delta'] == pytest.approx(
        r['log_perplexity'] - xla['log_perplexity'])
  rows = out.splitlines()
  assert rows[0].split()[:3] == ['model', 'decode', 'path']
  assert rows[1].split()[-5:] == [f"{xla['log_perplexity']:.4f}", '+0.0000',
                                  '0.00e+00', '1.0000',
                                  f"{xla['accuracy']:.4f}"]
  assert f'the weights of {checkpoint} (step 2)' in out
  assert 'reference targets of 2 validation examples' in out


def test_plot_sweep_writes_png(tmp_path):
  rows = []
  for d, speedup in ((32, 1.5), (64, 2.0)):
    rows.append({'d_model': d, 'models': {
        'dense': {'speedup': 1.0, 'speedup_per_block': 1.0},
        'sparse': {'speedup': speedup, 'speedup_per_block': 2 * speedup}}})
  path = tmp_path / 'sweep.png'
  bench_format.plot_sweep({'names': ['dense', 'sparse'], 'rows': rows},
                          str(path))
  assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_sweep_writes_plot_and_json(tmp_path, capsys):
  dense, sparse = _configs(tmp_path)
  plot, path = tmp_path / 'sweep.png', tmp_path / 'sweep.json'
  code, out, err = _run(capsys, f'--config_file={dense}',
                        f'--config_file={dense}+{sparse}', '--sweep',
                        '--sweep_d_models=32,64', '--tokens=2',
                        '--prompt_len=3', '--repeats=1', f'--plot={plot}',
                        f'--json={path}')
  assert code == 0, err
  assert plot.read_bytes()[:4] == b'\x89PNG'
  report = json.loads(path.read_text())
  assert [row['d_model'] for row in report['rows']] == [32, 64]
  for row in report['rows']:
    assert row['models']['dense']['speedup'] == 1.0
    assert row['models']['dense+sparse']['bytes_per_token'] < (
        row['models']['dense']['bytes_per_token'])
  # The table printed (a row per d_model) is the JSON's.
  assert report['tables']['sweep'] == bench_format.sweep_table(report)
  assert out.splitlines()[:3] == bench_format.common.format_aligned(
      report['tables']['sweep']).splitlines()
  assert [r[0] for r in report['tables']['sweep']['rows']] == ['32', '64']


def test_console_script(tmp_path):
  dense, _ = _configs(tmp_path)
  exe = os.path.join(os.path.dirname(sys.executable), 'terraformer-bench')
  done = subprocess.run([exe, f'--config_file={dense}', '--tokens=2',
                         '--prompt_len=2', '--repeats=1'],
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.splitlines()[1].split()[0] == 'dense'


def test_project_layers_with_compare_trax_is_one_line_error(tmp_path, capsys):
  dense, _ = _configs(tmp_path)
  code, _, err = _run(capsys, f'--config_file={dense}', '--compare_trax',
                      '--project_layers=6')
  assert code == 2
  _one_line_error(err, '--project_layers and --compare_trax')


def test_profile_dir_writes_a_trace_per_model(tmp_path, capsys):
  dense, _ = _configs(tmp_path)
  code, out, err = _run(capsys, f'--config_file={dense}', '--tokens=2',
                        '--prompt_len=3', f'--profile_dir={tmp_path / "p"}')
  assert code == 0, err
  assert 'trace of 2 steps' in out
  traces = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / 'p' /
                                                          'dense')
            for f in files if f.endswith('.xplane.pb')]
  assert traces and all(os.path.getsize(t) > 0 for t in traces)
  # The summary of the trace: the 2 timed steps' operations, by kind, and
  # the slowest ones, each found in the compiled step's HLO.
  assert 'dense: 2 steps, ' in out
  lines = out.splitlines()
  # The steps' wall time, and the part of it in which an operation runs.
  wall, busy = map(float, re.search(
      r'wall ([\d.]+) ms per step, an operation running in ([\d.]+) of them',
      out).groups())
  assert 0 < busy <= wall
  by_kind = next(l for l in lines if l.startswith('  by kind: '))
  assert 'fusion' in by_kind
  slowest = lines[lines.index('  slowest (ms/step):') + 1:]
  assert len(slowest) >= 5
  for line in slowest[:5]:
    parts = line.split(maxsplit=2)  # ms, operation, its HLO line
    assert len(parts) == 3 and float(parts[0]) >= 0, line
    assert re.match(r'\(?[a-z]+\d*\[', parts[2].split()[1]), line  # a shape


def test_profile_dir_must_be_a_folder(tmp_path, capsys):
  dense, _ = _configs(tmp_path)
  code, _, err = _run(capsys, f'--config_file={dense}',
                      f'--profile_dir={dense}')
  assert code != 0
  _one_line_error(err, '--profile_dir', 'is not a folder')
