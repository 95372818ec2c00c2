"""terraformer-decode: decodes text with a trained checkpoint.

  terraformer-decode --config_file=F --output_dir=CKPT_DIR
      (--input=TEXT | --input_file=FILE [--whole_file])
      [--method=greedy|sample|beam] [--temperature=T] [--top_k=K]
      [--top_p=P] [--beam_size=B] [--length_penalty=A] [--no_repeat_ngram=N]
      [--max_length=N]
      [--seed=S] [--batch_size=N] [--input_len=N] [--truncate]

Loads `CKPT_DIR/model.pkl.gz` (written by terraformer-train with the same
config) into the model bound to `terraformer.train.model`, built in predict
mode, tokenizes with the config's vocab (`terraformer.text_vocab`), decodes
and prints one line per input (newlines in the output become spaces).

  * Encoder-decoder models (ScalingTransformer, Terraformer): each input is
    an article; it is tokenized, EOS appended (as in training) and padded to
    the input length: `--input_len`, default the training input length bound
    in the config (`summarization_stream`/`seq2seq_stream`/`c4_stream
    .input_len`), else the model's maximum length.
  * Decoder-only LMs (ScalingTransformerLM): each input is a prompt; the
    continuation is printed.

`--input_file` holds one input per line (blank lines skipped); with
`--whole_file` the whole file is one input (e.g. a paper with paragraphs).
An input longer than the input length (LM: prompt + max_length longer than
the model's maximum length) is an error unless `--truncate` is given, which
keeps the first tokens of an article (the last tokens of a prompt) and warns
on stderr. A timing line goes to stderr.
"""
import os
import sys
import time

from absl import flags

from terraformer import config
from terraformer import errors
from terraformer.cli import common

PROG = 'terraformer-decode'


def _define_flags(flag_values):
  define = lambda kind, name, default, text, **kw: kind(
      name, default, text, flag_values=flag_values, **kw)
  define(flags.DEFINE_string, 'output_dir', None,
         'Directory with the checkpoint (model.pkl.gz) of terraformer-train.')
  define(flags.DEFINE_string, 'input', None, 'Text to decode.')
  define(flags.DEFINE_string, 'input_file', None,
         'File of inputs, one per line (see --whole_file).')
  define(flags.DEFINE_bool, 'whole_file', False,
         'Treat the whole --input_file as one input.')
  flags.DEFINE_enum('method', 'greedy', ['greedy', 'sample', 'beam'],
                    'Decoding method.', flag_values=flag_values)
  define(flags.DEFINE_float, 'temperature', 1.0,
         'Sampling temperature (method=sample; 0 = greedy). The paper decodes '
         'abstracts at 0.5.')
  define(flags.DEFINE_integer, 'top_k', 0,
         'Sample among the k most probable tokens (0: all).', lower_bound=0)
  define(flags.DEFINE_float, 'top_p', 1.0, 'Nucleus sampling probability.')
  define(flags.DEFINE_integer, 'beam_size', 4, 'Beams (method=beam).',
         lower_bound=1)
  define(flags.DEFINE_float, 'length_penalty', 0.0,
         'Beam score log_p / ((5 + len) / 6) ** alpha; this is alpha.')
  define(flags.DEFINE_integer, 'no_repeat_ngram', 0,
         'N > 0: no output repeats one of its own token N-grams (0: off, as '
         'Trax).', lower_bound=0)
  define(flags.DEFINE_integer, 'max_length', None,
         'Most tokens to generate; default the training target length, '
         'else 128.', lower_bound=1)
  define(flags.DEFINE_integer, 'seed', 0, 'Sampling seed.')
  define(flags.DEFINE_integer, 'batch_size', 8, 'Inputs decoded together.',
         lower_bound=1)
  define(flags.DEFINE_integer, 'input_len', None,
         'Encoder input length (encoder-decoder models).', lower_bound=1)
  define(flags.DEFINE_bool, 'truncate', False,
         'Truncate over-long inputs (with a warning) instead of failing.')


def read_inputs(flag_values):
  """The input texts; TerraformerError if missing, ambiguous or empty."""
  text, path = flag_values.input, flag_values.input_file
  if (text is None) == (path is None):
    raise errors.TerraformerError(
        'give exactly one of --input=TEXT or --input_file=FILE')
  if path is not None:
    if not os.path.isfile(path):
      raise errors.TerraformerError(f'input file {path!r} not found')
    content = read_text_file(path, 'input file')
    inputs = ([content] if flag_values.whole_file
              else content.splitlines())
    inputs = [t.strip() for t in inputs if t.strip()]
    if not inputs:
      raise errors.TerraformerError(f'input file {path!r} is empty')
    return inputs
  if not text.strip():
    raise errors.TerraformerError('--input is empty')
  return [text.strip()]


def read_text_file(path, what):
  """The UTF-8 text of `path`; TerraformerError if binary or not UTF-8."""
  try:
    with open(path, encoding='utf-8') as f:
      content = f.read()
  except UnicodeDecodeError as e:
    raise errors.TerraformerError(
        f'{what} {path!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} '
        f'at offset {e.start})') from None
  except OSError as e:
    raise errors.TerraformerError(
        f'cannot read {what} {path!r}: {e.strerror}') from None
  if '\x00' in content:
    raise errors.TerraformerError(
        f'{what} {path!r} is binary (NUL byte at offset '
        f'{content.index(chr(0))}), not text')
  return content


def check_checkpoint(output_dir):
  """TerraformerError unless `output_dir` holds model.pkl.gz (no imports)."""
  if not output_dir:
    raise errors.TerraformerError('--output_dir is required')
  if not os.path.isfile(os.path.join(os.path.expanduser(output_dir),
                                     'model.pkl.gz')):
    raise errors.TerraformerError(
        f'no checkpoint model.pkl.gz in {output_dir}; train one with '
        'terraformer-train --output_dir=...')


def _precheck(flag_values):
  check_checkpoint(flag_values.output_dir)
  read_inputs(flag_values)


def _warn(message):
  print(f'{PROG}: warning: {message}', file=sys.stderr)


def _encode(vocab, texts, encoder_decoder, input_len, max_length, limit,
            truncate):
  """Token lists of the inputs, checked against the length limits."""
  from terraformer.loading import vocab as loading_vocab  # pylint: disable=g-import-not-at-top
  rows = []
  for i, text in enumerate(texts):
    where = f'input {i + 1}' if len(texts) > 1 else 'the input'
    if encoder_decoder:
      ids, cut = loading_vocab.encode_input(vocab, text, input_len)
      length, room = len(ids) + cut, input_len
    else:
      ids = list(vocab.encode(text))
      room = limit - max_length if limit else len(ids)
      length, cut = len(ids), max(0, len(ids) - room)
      ids = ids[cut:]  # A prompt keeps its end.
    if cut and not truncate:
      takes = (f'input length {room}' if encoder_decoder else
               f'{room} prompt tokens with max_length {max_length}')
      raise errors.TerraformerError(
          f'{where} has {length} tokens, more than the model takes '
          f'({takes}); pass --truncate to cut it')
    if cut:
      _warn(f'{where}: {length} tokens truncated to {room}')
    if not ids:
      raise errors.TerraformerError(f'{where} has no tokens left')
    rows.append(ids)
  return rows


def _decode(flag_values):
  from trax import shapes  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from terraformer.decoding import search as decoding  # pylint: disable=g-import-not-at-top
  from terraformer.loading import model as loading_model  # pylint: disable=g-import-not-at-top
  from terraformer.loading import vocab as loading_vocab  # pylint: disable=g-import-not-at-top

  texts = read_inputs(flag_values)
  config.require_bindings('terraformer.text_vocab', ['vocab_size'])
  model_fn = config.model_from_config()
  vocab = loading_vocab.text_vocab()
  probe = model_fn(mode='predict')
  encoder_decoder = decoding.is_encoder_decoder(probe)
  limit = decoding.model_max_length(probe)
  bound_input, bound_target = loading_vocab.training_lengths()
  max_length = (flag_values.max_length or
                (bound_target if encoder_decoder else None) or 128)
  input_len = None
  if encoder_decoder:
    input_len = flag_values.input_len or bound_input or limit
    if not input_len:
      raise errors.TerraformerError('pass --input_len')
    if limit and input_len > limit:
      raise errors.TerraformerError(
          f'--input_len={input_len} exceeds the model\'s maximum length '
          f'{limit}')
  if limit and max_length > limit:
    raise errors.TerraformerError(
        f'--max_length={max_length} exceeds the model\'s maximum length '
        f'{limit}')
  rows = _encode(vocab, texts, encoder_decoder, input_len, max_length, limit,
                 flag_values.truncate)

  batch = min(flag_values.batch_size, len(rows))
  token = shapes.ShapeDtype((batch, 1), np.int32)
  signature = ((shapes.ShapeDtype((batch, input_len), np.int32), token)
               if encoder_decoder else token)
  model, step = loading_model.load_model(model_fn, flag_values.output_dir,
                                         'predict', signature)
  kwargs = dict(max_length=max_length, method=flag_values.method,
                temperature=flag_values.temperature, top_k=flag_values.top_k,
                top_p=flag_values.top_p, beam_size=flag_values.beam_size,
                length_penalty=flag_values.length_penalty,
                no_repeat_ngram=flag_values.no_repeat_ngram,
                eos_id=vocab.eos_id, seed=flag_values.seed)
  if encoder_decoder:
    kwargs['input_length'] = input_len
  start = time.time()
  outputs = decoding.decode_batches(model, rows, batch_size=batch,
                                    progress=len(rows) > batch, **kwargs)
  seconds = time.time() - start
  for ids in outputs:
    print(loading_vocab.detokenize(vocab, ids).replace('\n', ' '), flush=True)
  n_tokens = sum(len(o) for o in outputs)
  print(f'{PROG}: {len(rows)} input(s), {n_tokens} tokens in {seconds:.2f} s '
        f'({1000 * seconds / max(n_tokens, 1):.1f} ms/token, compilation '
        f'included; batch {batch}, checkpoint step {step})', file=sys.stderr)
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _decode, precheck=_precheck)


if __name__ == '__main__':
  sys.exit(main())
