"""Scores a salient-extraction run, or makes the scorer ablation's table.

  python -m terraformer.cli.extraction_eval --config_file=F [--config=B]
      --output_dir=RUN [--split=validation] [--batches=16]
  python -m terraformer.cli.extraction_eval --row='LABEL|MODEL|LEN|RUN,RUN'
      [--row=...] [--bench=memory_bench.json ...]

With --output_dir: loads the run's checkpoint (the gin model bound to
`terraformer.train.model`), decodes --batches batches of the gin eval stream
(`salient_extraction_stream`, its split replaced by --split) greedily (the
encoder once, then token by token) and prints one JSON line: the step, token F1, exact match and the first
pooling's recall of the salient positions (`terraformer.evaluation.
extraction`).

With --row (Pyramidion's scorer ablation, experiments/long_input_scorers.sh):
prints the table `{"columns": [...], "rows": [...]}` that tools/results.py
records: per row (LABEL; MODEL, the row's name in the --bench report of
terraformer-memory-bench --json, or '-'; LEN, its input length there; the
run folders, one per seed, or none) the test scores at each run's step
chosen on validation (each run holds eval_{validation,test}_STEP.json),
their mean and per-seed values, the step time and compiled memory (of the
--bench reports, one or more, e.g. one per input length).
"""
import json
import sys

from absl import flags

from terraformer import errors
from terraformer.cli import common

PROG = 'extraction-eval'
STREAM = 'salient_extraction_stream'


def _define_flags(flag_values):
  flags.DEFINE_string('output_dir', None, 'Run folder (its checkpoint).',
                      flag_values=flag_values)
  flags.DEFINE_enum('split', 'validation', ['validation', 'test'],
                    'Split of the eval stream to score.',
                    flag_values=flag_values)
  flags.DEFINE_integer('batches', 16, 'Eval batches to score.',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_multi_string('row', None, "Table row 'LABEL|MODEL|LEN|RUNS'.",
                            flag_values=flag_values)
  flags.DEFINE_multi_string('bench', None,
                            'terraformer-memory-bench --json report(s).',
                            flag_values=flag_values)


def _rows(specs):
  rows = []
  for spec in specs:
    parts = spec.split('|')
    if len(parts) != 4 or not parts[2].isdigit():
      raise errors.TerraformerError(
          f"--row={spec!r} is not 'LABEL|MODEL|LEN|RUN,RUN,...'")
    label, model, length, runs = parts
    rows.append((label, None if model == '-' else model, int(length),
                 [r for r in runs.split(',') if r]))
  return rows


def _precheck(flag_values):
  if flag_values.row:
    _rows(flag_values.row)
  elif not flag_values.output_dir:
    raise errors.TerraformerError('give --output_dir (a run) or --row')


def _table(flag_values):
  from terraformer.evaluation import extraction  # pylint: disable=g-import-not-at-top
  report = {'models': {}}
  for path in flag_values.bench or ():
    with open(path, encoding='utf-8') as f:
      # Several reports (other lengths): one list of lengths per model.
      for name, rows in json.load(f).get('models', {}).items():
        report['models'].setdefault(name, []).extend(rows)
  print(json.dumps(extraction.scorers_table(_rows(flag_values.row), report),
                   indent=1, ensure_ascii=False))


def _score(flag_values):
  import itertools  # pylint: disable=g-import-not-at-top
  import gin  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trax import shapes  # pylint: disable=g-import-not-at-top
  from terraformer import config  # pylint: disable=g-import-not-at-top
  from terraformer.evaluation import extraction  # pylint: disable=g-import-not-at-top
  from terraformer.loading import model as loading_model  # pylint: disable=g-import-not-at-top
  from terraformer.loading import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  config.require_bindings('terraformer.train', ['model', 'eval_stream'])
  stream_ref = gin.query_parameter('terraformer.train.eval_stream')
  if stream_ref.configurable.name != STREAM:
    raise errors.TerraformerError(
        f'the eval stream is {stream_ref.configurable.name}, not {STREAM}')
  stream = stream_ref.scoped_configurable_fn(split=flag_values.split)
  batches = list(itertools.islice(stream, flag_values.batches))
  x, y, _ = batches[0]
  signature = (shapes.ShapeDtype(x.shape, x.dtype),
               shapes.ShapeDtype(y.shape, y.dtype))
  model_fn = config.model_from_config()
  model, step = loading_model.load_model(model_fn, flag_values.output_dir,
                                         'eval', signature)
  predict, _ = loading_model.load_model(
      model_fn, flag_values.output_dir, 'predict',
      (signature[0], shapes.ShapeDtype((x.shape[0], 1), np.int32)))
  text_vocab = vocab_lib.text_vocab()
  eos_id = text_vocab.eos_id
  bound = lambda arg: vocab_lib.gin_binding(f'{STREAM}.{arg}',
                                            scopes=('eval/', ''))
  # Indexed markers: the ids past the text's vocabulary.
  markers_from = text_vocab.vocab_size if bound('indexed_markers') else None
  result = extraction.score(
      batches, extraction.model_decode(predict, eos_id),
      extraction.model_winners(model), eos_id, bound('declare_every'),
      markers_from)
  print(json.dumps(dict(output_dir=flag_values.output_dir,
                        split=flag_values.split, step=int(step), **result)))


def main(argv=None):
  return common.run(
      PROG, argv, _define_flags,
      lambda fv: _table(fv) if fv.row else _score(fv), precheck=_precheck)


if __name__ == '__main__':
  sys.exit(main())
