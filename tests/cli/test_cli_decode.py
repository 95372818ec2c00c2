"""terraformer-decode on tiny trained checkpoints: outputs and errors."""
import os
import subprocess
import sys

import numpy as np
from trax import shapes

import tiny_checkpoints
from terraformer import config
from terraformer.decoding import search as decoding
from terraformer.loading import vocab as loading_vocab
from terraformer.cli import decode as decode_cli

HERE = os.path.dirname(os.path.abspath(__file__))
ARTICLE = ('We study sparse variants of every layer of the Transformer. '
           'Sparse layers are enough to match the perplexity of a dense '
           'model with the same number of parameters.')


def _run(capsys, run, *args):
  code = decode_cli.main(['terraformer-decode',
                          *tiny_checkpoints.config_args(run), *args])
  out, err = capsys.readouterr()
  return code, out, err


def _assert_one_line_error(err, *parts):
  lines = [l for l in err.splitlines() if l.strip()]
  assert len(lines) == 1, err
  assert lines[0].startswith('terraformer-decode: error: '), err
  for part in parts:
    assert part in lines[0], err
  assert 'Traceback' not in err


def _oracle_predict_model(run, ckpt, signature):
  """The configured predict model with weights from Trax's own loader."""
  config.parse_gin(*tiny_checkpoints.config_args_split(run))
  model = config.model_from_config()(mode='predict')
  model.init_from_file(os.path.join(ckpt, 'model.pkl.gz'), weights_only=True,
                       input_signature=signature)
  return model, loading_vocab.text_vocab()


def test_encdec_output_matches_trax_loaded_model(encdec_checkpoint, capsys):
  run, ckpt, _ = encdec_checkpoint
  code, out, err = _run(capsys, run, f'--output_dir={ckpt}',
                        f'--input={ARTICLE}', '--max_length=12')
  assert code == 0, err
  assert len(out.splitlines()) == 1
  assert 'ms/token' in err and 'checkpoint step 2' in err
  # Oracle: weights loaded by Trax's `init_from_file`, the input prepared as
  # the training data is (ids + EOS, zero-padded to the input length).
  length = tiny_checkpoints.INPUT_LEN
  model, vocab = _oracle_predict_model(
      run, ckpt, (shapes.ShapeDtype((1, length), np.int32),
                  shapes.ShapeDtype((1, 1), np.int32)))
  ids = (vocab.encode(ARTICLE) + [vocab.eos_id])[:length]
  tokens = decoding.decode(model, [ids], max_length=12, input_length=length,
                           eos_id=vocab.eos_id)
  expected = vocab.decode(decoding.strip_eos(tokens[0], vocab.eos_id))
  assert out.splitlines()[0] == expected.replace('\n', ' ')


def test_input_file_lines_whole_file_and_methods(encdec_checkpoint, capsys,
                                                 tmp_path):
  run, ckpt, _ = encdec_checkpoint
  path = tmp_path / 'inputs.txt'
  path.write_text('First article about sparsity.\n\n'
                  'Second article, about attention.\n')
  code, lines, err = _run(capsys, run, f'--output_dir={ckpt}',
                          f'--input_file={path}', '--max_length=6')
  assert code == 0, err
  lines = lines.splitlines()
  assert len(lines) == 2  # The blank line is skipped.
  code, whole, err = _run(capsys, run, f'--output_dir={ckpt}',
                          f'--input_file={path}', '--whole_file',
                          '--max_length=6')
  assert code == 0, err
  assert len(whole.splitlines()) == 1
  # Each line decodes as it does alone (one padded length, no cross-talk).
  code, alone, _ = _run(capsys, run, f'--output_dir={ckpt}',
                        '--input=Second article, about attention.',
                        '--max_length=6')
  assert code == 0 and alone.splitlines() == lines[1:]
  for method in (['--method=beam', '--beam_size=2'],
                 ['--method=sample', '--temperature=0.5', '--top_k=5',
                  '--seed=3']):
    code, out, err = _run(capsys, run, f'--output_dir={ckpt}',
                          f'--input_file={path}', '--max_length=6', *method)
    assert code == 0, err
    assert len(out.splitlines()) == 2
  again = _run(capsys, run, f'--output_dir={ckpt}', f'--input_file={path}',
               '--max_length=6', *method)[1]
  assert again == out  # Sampling with a seed is reproducible.


def test_lm_prompt_continuation(lm_checkpoint, capsys):
  run, ckpt, _ = lm_checkpoint
  prompt = 'Sparse layers are'
  code, out, err = _run(capsys, run, f'--output_dir={ckpt}',
                        f'--input={prompt}', '--max_length=8')
  assert code == 0, err
  model, vocab = _oracle_predict_model(run, ckpt,
                                       shapes.ShapeDtype((1, 1), np.int32))
  tokens = decoding.decode(model, [vocab.encode(prompt)], max_length=8,
                           eos_id=vocab.eos_id)
  assert out.splitlines() == [
      vocab.decode(decoding.strip_eos(tokens[0], vocab.eos_id))]
  # A prompt that leaves no room for max_length tokens: error, or truncated.
  long_prompt = ' '.join(['sparse attention layers'] * 40)
  code, _, err = _run(capsys, run, f'--output_dir={ckpt}',
                      f'--input={long_prompt}', '--max_length=8')
  assert code == 2
  _assert_one_line_error(err, 'tokens, more than the model takes',
                         '--truncate')
  code, out, err = _run(capsys, run, f'--output_dir={ckpt}',
                        f'--input={long_prompt}', '--max_length=8',
                        '--truncate')
  assert code == 0, err
  assert 'warning' in err and 'truncated to 56' in err
  assert len(out.splitlines()) == 1


def test_terraformer(tmp_path_factory, capsys):
  run = tiny_checkpoints.TERRAFORMER
  ckpt = str(tmp_path_factory.mktemp('terraformer') / 'ckpt')
  # One step: the checks compare two decodes of the checkpoint's weights.
  tiny_checkpoints.train(run, ckpt, steps=1)
  capsys.readouterr()
  code, out, err = _run(capsys, run, f'--output_dir={ckpt}',
                        f'--input={ARTICLE}', '--max_length=8')
  assert code == 0, err
  model, vocab = _oracle_predict_model(
      run, ckpt, (shapes.ShapeDtype((1, tiny_checkpoints.INPUT_LEN),
                                    np.int32),
                  shapes.ShapeDtype((1, 1), np.int32)))
  ids = (vocab.encode(ARTICLE) + [vocab.eos_id])[:tiny_checkpoints.INPUT_LEN]
  tokens = decoding.decode(model, [ids], max_length=8, eos_id=vocab.eos_id,
                           input_length=tiny_checkpoints.INPUT_LEN)
  assert out.splitlines() == [
      vocab.decode(decoding.strip_eos(tokens[0], vocab.eos_id))]


def test_user_errors(encdec_checkpoint, capsys, tmp_path):
  run, ckpt, _ = encdec_checkpoint
  empty_file = tmp_path / 'empty.txt'
  empty_file.write_text('\n  \n')
  cases = [
      ([f'--output_dir={tmp_path}', '--input=x'],
       ['no checkpoint model.pkl.gz in']),
      ([f'--output_dir={ckpt}', '--input=   '], ['--input is empty']),
      ([f'--output_dir={ckpt}', f'--input_file={empty_file}'],
       ['is empty']),
      ([f'--output_dir={ckpt}', '--input_file=/no/such/file'],
       ["input file '/no/such/file' not found"]),
      ([f'--output_dir={ckpt}'], ['exactly one of --input']),
      ([f'--output_dir={ckpt}', '--input=a', f'--input_file={empty_file}'],
       ['exactly one of --input']),
      ([f'--output_dir={ckpt}', '--input=a', '--config=ScalingTransformer.x = 1'],
       ['bad gin config']),
      ([f'--output_dir={ckpt}', '--input=a',
        '--config=ScalingTransformer.d_model = 64'],
       ['was it trained with this config?']),
      ([f'--output_dir={ckpt}', '--input=a',
        "--config=text_vocab.vocab_path = '/no/spm.model'"],
       ['SentencePiece model not found: /no/spm.model']),
      ([f'--output_dir={ckpt}', f'--input={ARTICLE}', '--input_len=8'],
       ['tokens, more than the model takes (input length 8)',
        '--truncate']),
      ([f'--output_dir={ckpt}', '--input=a', '--max_length=1000'],
       ['exceeds the model\'s maximum length 128']),
      ([f'--output_dir={ckpt}', '--input=a', '--method=nucleus'],
       ['method']),
  ]
  for args, parts in cases:
    code, out, err = _run(capsys, run, *args)
    assert code == 2, (args, err)
    assert out == ''
    _assert_one_line_error(err, *parts)
  # The same over-long input, truncated on request, with a warning.
  code, out, err = _run(capsys, run, f'--output_dir={ckpt}',
                        f'--input={ARTICLE}', '--input_len=8', '--truncate',
                        '--max_length=4')
  assert code == 0, err
  assert 'warning: the input: ' in err and 'truncated to 8' in err
  assert len(out.splitlines()) == 1


def test_console_script_one_line_error(tmp_path):
  exe = os.path.join(os.path.dirname(sys.executable), 'terraformer-decode')
  done = subprocess.run(
      [exe, *tiny_checkpoints.config_args(tiny_checkpoints.ENCDEC),
       f'--output_dir={tmp_path}', '--input=hello'],
      capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=HERE))
  assert done.returncode == 2
  assert done.stderr.splitlines() == [
      f'terraformer-decode: error: no checkpoint model.pkl.gz in {tmp_path}; '
      'train one with terraformer-train --output_dir=...']
