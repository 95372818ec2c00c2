"""Out-of-distribution generalization on long copy and addition (§4.3, Table 4).

Each cell of the table (a task and a model, one gin file `gin/ood/<cell>.gin`)
is trained with `terraformer.train` on short numbers, then decoded greedily
(no teacher forcing) on numbers over twice as long, and scored with the two
columns of Table 4:

  per-token accuracy: for each example, the prediction `p` (decoded tokens
    before the first EOS) and the target `t` (its digits before EOS) are
    compared position by position: correct tokens are the positions
    `i < min(|p|, |t|)` with `p[i] == t[i]`, and the example counts
    `max(|p|, |t|)` tokens, so missing tokens (an early EOS) and extra tokens
    (a late or no EOS) are errors. The accuracy is the sum of correct tokens
    over the sum of counted tokens, over all examples.
  sequence accuracy: the share of examples whose prediction equals the
    target exactly, EOS included (a prediction cut off by the decoding
    length, with no EOS, is wrong).
"""
import collections
import json
import os
import time

import gin
import numpy as np

from terraformer import errors
from terraformer.data import arithmetic

EOS_ID = arithmetic.EOS_ID


class Score(collections.namedtuple(
    'Score', ['correct_tokens', 'total_tokens', 'correct_sequences',
              'n_sequences'])):
  """Counts behind the two accuracies; add Scores to pool batches."""

  __slots__ = ()

  def __add__(self, other):
    return Score(*(a + b for a, b in zip(self, other)))

  @property
  def token_accuracy(self):
    return self.correct_tokens / self.total_tokens if self.total_tokens else 0.

  @property
  def sequence_accuracy(self):
    return (self.correct_sequences / self.n_sequences if self.n_sequences
            else 0.)


EMPTY_SCORE = Score(0, 0, 0, 0)


def until_eos(row, eos_id=EOS_ID):
  """(tokens before the first EOS, whether there was an EOS)."""
  row = np.asarray(row).reshape(-1).tolist()
  if eos_id in row:
    return row[:row.index(eos_id)], True
  return row, False


def score_example(prediction, target, eos_id=EOS_ID):
  """Score of one example; `target` must contain an EOS."""
  p, p_has_eos = until_eos(prediction, eos_id)
  t, t_has_eos = until_eos(target, eos_id)
  if not t_has_eos:
    raise errors.TerraformerError(f'target has no EOS ({eos_id}): {t}')
  correct = sum(a == b for a, b in zip(p, t))
  exact = p_has_eos and p == t
  return Score(correct, max(len(p), len(t)), int(exact), 1)


def score_batch(predictions, targets, weights=None, eos_id=EOS_ID):
  """Pooled Score of a batch; rows whose weights are all 0 are skipped.

  Args:
    predictions: int array [batch, any length], greedy decodes.
    targets: int array [batch, Lt], each row ending in EOS then padding.
    weights: optional [batch, Lt]; all-zero rows are batch padding.
    eos_id: the end-of-sequence id.
  """
  predictions, targets = np.asarray(predictions), np.asarray(targets)
  if len(predictions) != len(targets):
    raise errors.TerraformerError(
        f'{len(predictions)} predictions for {len(targets)} targets')
  keep = (np.ones(len(targets), bool) if weights is None
          else np.asarray(weights).reshape(len(targets), -1).any(axis=1))
  score = EMPTY_SCORE
  for p, t, k in zip(predictions, targets, keep):
    if k:
      score += score_example(p, t, eos_id)
  return score



def predict_model(model_fn, weights, input_signature):
  """`model_fn(mode='predict')` holding trained `weights`.

  Args:
    model_fn: gin model function (the one trained).
    weights: weights tree of the trained (train-mode) model.
    input_signature: (inputs, prev token) ShapeDtypes it is initialized on.
  """
  model = model_fn(mode='predict')
  model.init(input_signature)
  model.weights = weights
  return model


def greedy_decodes(make_model, split, stream=arithmetic.arithmetic_stream,
                   n_examples=256, batch_size=64, progress=False):
  """Yields `(inputs, targets, mask, predictions)` batches of one split.

  Args:
    make_model: called once, with the (inputs, prev token) ShapeDtypes of
      the first batch, returns the predict-mode model.
    split: the stream's split.
    stream: data stream function, called as `stream(split=, repeat=False,
      n_examples=, batch_size=)` (other settings from gin); its targets end
      with EOS.
    n_examples: examples decoded (the same ones on every call).
    batch_size: rows decoded at once.
    progress: show a per-token progress bar.

  Each row is decoded greedily (no teacher forcing) for up to the stream's
  target length (the longest possible target, EOS included).
  """
  from terraformer.decoding import search as decoding  # pylint: disable=g-import-not-at-top
  from trax import shapes  # pylint: disable=g-import-not-at-top
  model = None
  for inputs, targets, mask in stream(split=split, repeat=False,
                                      n_examples=n_examples,
                                      batch_size=batch_size):
    if model is None:
      model = make_model((shapes.ShapeDtype(inputs.shape, np.int32),
                          shapes.ShapeDtype((inputs.shape[0], 1), np.int32)))
    predictions = decoding.decode(
        model, inputs, max_length=targets.shape[1], method='greedy',
        eos_id=EOS_ID, pad_id=arithmetic.PAD_ID,
        input_length=inputs.shape[1], progress=progress)
    yield inputs, targets, mask, np.asarray(predictions)


@gin.configurable(module='terraformer', denylist=['model_fn', 'weights'])
def evaluate_cell(model_fn, weights, stream=arithmetic.arithmetic_stream,
                  splits=('validation', 'ood'), n_examples=256,
                  batch_size=64, progress=False):
  """Greedy decoding (no teacher forcing) of `n_examples` per split.

  Args:
    model_fn: the trained gin model function (encoder-decoder contract).
    weights: its trained weights.
    stream: data stream function (see `greedy_decodes`).
    splits: splits scored: 'validation' (training lengths, a sanity check)
      and 'ood' (the table).
    n_examples: examples decoded per split (the same ones on every call).
    batch_size: rows decoded at once.
    progress: show a per-token progress bar.

  Returns:
    {split: Score}. A model that does not stop gets extra tokens counted as
    errors.
  """
  models = []

  def make_model(signature):  # One predict model for every split.
    if not models:
      models.append(predict_model(model_fn, weights, signature))
    return models[0]

  scores = {}
  for split in splits:
    score = EMPTY_SCORE
    for _, targets, mask, predictions in greedy_decodes(
        make_model, split, stream, n_examples, batch_size, progress):
      score += score_batch(predictions, targets, mask)
    scores[split] = score
  return scores


# The table: tasks x models; cell `<task>_<model>` is `gin/ood/<cell>.gin`.
TASKS = ('copy', 'add')
MODELS = ('transformer', 'terraformer_sru', 'terraformer_nosru')
MODEL_NAMES = {'transformer': 'Transformer',
               'terraformer_sru': 'Terraformer (low-rank SRU)',
               'terraformer_nosru': 'Terraformer (no SRU)'}
DEFAULT_CELLS = tuple(f'{t}_{m}' for t in TASKS for m in MODELS)
RESULT_FILE = 'ood_result.json'
TABLE_JSON, TABLE_MD = 'ood_table.json', 'ood_table.md'


def cell_config_file(cell, gin_dir):
  """`cell` as (name, gin file): a name in `gin_dir/ood/` or a .gin path."""
  if cell.endswith('.gin') or os.sep in cell:
    path = cell
    name = os.path.splitext(os.path.basename(cell))[0]
  else:
    path, name = os.path.join(gin_dir, 'ood', cell + '.gin'), cell
  if not os.path.isfile(path):
    raise errors.TerraformerError(f'no gin file for cell {cell!r}: {path}')
  return name, path


def _split_cell(name):
  for task in TASKS:
    if name.startswith(task + '_'):
      return task, name[len(task) + 1:]
  return '', name


def _n_params(weights):
  import jax  # pylint: disable=g-import-not-at-top
  return int(sum(np.size(w) for w in jax.tree_util.tree_leaves(weights)))


def _write_json(path, data):
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(data, f, indent=2)
  os.replace(tmp, path)


def _settings():
  """What the result depends on: the gin config (and, for the table, the
  task, its lengths and the steps)."""
  query = lambda name, default=None: _plain(_query(name, default))
  return {
      'task': query('terraformer.data.arithmetic_stream.task', 'copy'),
      'train_digits': [query('arithmetic_stream.train_min_digits', 1),
                       query('arithmetic_stream.train_max_digits', 128)],
      'eval_digits': [query('arithmetic_stream.eval_min_digits', 256),
                      query('arithmetic_stream.eval_max_digits', 300)],
      'steps': query('terraformer.train.steps', 1000),
      'seed': query('terraformer.train.random_seed', 0),
      'n_examples': query('terraformer.evaluate_cell.n_examples', 256),
      'gin_config': gin.config_str(),
  }


def _plain(value):
  """JSON-able: numbers and strings as they are, anything else as text."""
  if isinstance(value, (int, float, str, type(None))):
    return value
  return str(value)


def _query(name, default):
  try:
    return gin.query_parameter(name)
  except ValueError:
    return default


def run_cell(name, output_dir):
  """Trains (or resumes) and evaluates one cell, gin already configured.

  Writes `<output_dir>/RESULT_FILE`; if it exists with the same settings
  (gin config), returns it without training or decoding.
  """
  from terraformer.training import loop as training  # pylint: disable=g-import-not-at-top
  result_path = os.path.join(output_dir, RESULT_FILE)
  settings = _settings()
  if os.path.isfile(result_path):
    with open(result_path) as f:
      old = json.load(f)
    if old.get('settings') == settings:
      print(f'[{name}] done before: {result_path}', flush=True)
      return old
  task, model = _split_cell(name)
  print(f'[{name}] training in {output_dir}', flush=True)
  start = time.time()
  loop = training.train(output_dir)
  train_seconds = time.time() - start
  model_fn = gin.query_parameter('terraformer.train.model')
  model_fn = getattr(model_fn, 'scoped_configurable_fn', model_fn)
  print(f'[{name}] greedy decoding', flush=True)
  start = time.time()
  scores = evaluate_cell(model_fn, loop.model.weights)
  result = {
      'cell': name, 'task': settings['task'] or task, 'model': model,
      'parameters': _n_params(loop.model.weights), 'steps': loop.step,
      'train_seconds': round(train_seconds, 1),
      'eval_seconds': round(time.time() - start, 1),
      'scores': {split: dict(score._asdict(),
                             token_accuracy=score.token_accuracy,
                             sequence_accuracy=score.sequence_accuracy)
                 for split, score in scores.items()},
      'settings': settings,
  }
  _write_json(result_path, result)
  return result


def _pct(result, split, key):
  score = result['scores'].get(split)
  return '' if score is None else f'{100 * score[key]:.1f}%'


def _pooled(results, split, key):
  """Mean over seeds of one accuracy, and the per-seed values if several."""
  values = [r['scores'][split][key] for r in results
            if split in r['scores']]
  if not values:
    return ''
  text = f'{100 * np.mean(values):.1f}%'
  if len(values) > 1:
    text += ' (' + ', '.join(f'{100 * v:.1f}' for v in values) + ')'
  return text


def format_table(results):
  """Markdown: Table 4 (out of distribution, the paper's four columns, then
  the in-distribution token accuracy per task), then per-cell details.

  Results of the same task and model (seeds) are pooled: the mean, and with
  several seeds the per-seed values in parentheses.
  """
  models = list(dict.fromkeys(r['model'] for r in results))
  by_cell = collections.defaultdict(list)
  for r in results:
    by_cell[(r['task'], r['model'])].append(r)
  tasks = [t for t in TASKS if any(r['task'] == t for r in results)]
  header = (['Model'] + [c for t in tasks for c in (t, f'{t} (seq)')] +
            [f'{t} in-dist.' for t in tasks])
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '---|' * len(header)]
  for model in models:
    row = [MODEL_NAMES.get(model, model)]
    for task in tasks:
      rs = by_cell.get((task, model), [])
      row += [_pooled(rs, 'ood', 'token_accuracy'),
              _pooled(rs, 'ood', 'sequence_accuracy')]
    row += [_pooled(by_cell.get((task, model), []), 'validation',
                    'token_accuracy') for task in tasks]
    lines.append('| ' + ' | '.join(row) + ' |')
  lines += ['', '| cell | seed | parameters | steps | train digits | '
            'eval digits | in-dist. token | in-dist. seq | OOD token | '
            'OOD seq | train s | decode s |', '|' + '---|' * 12]
  for r in results:
    s = r['settings']
    lines.append('| ' + ' | '.join([
        r['cell'], str(s.get('seed', '')), f'{r["parameters"]:,}',
        str(r['steps']),
        '{}-{}'.format(*s['train_digits']), '{}-{}'.format(*s['eval_digits']),
        _pct(r, 'validation', 'token_accuracy'),
        _pct(r, 'validation', 'sequence_accuracy'),
        _pct(r, 'ood', 'token_accuracy'), _pct(r, 'ood', 'sequence_accuracy'),
        f'{r["train_seconds"]:.0f}', f'{r["eval_seconds"]:.0f}']) + ' |')
  return '\n'.join(lines)


def _check_cell(name):
  """Raises TerraformerError if the configured cell cannot run."""
  missing = [p for p in ('model', 'train_stream', 'eval_stream')
             if _query(f'terraformer.train.{p}', None) is None]
  if missing:
    raise errors.TerraformerError(
        f'cell {name}: missing gin binding(s): ' +
        ', '.join(f'terraformer.train.{p}' for p in missing))
  for p in ('train_stream', 'eval_stream'):
    stream_fn = gin.query_parameter(f'terraformer.train.{p}')
    try:
      getattr(stream_fn, 'scoped_configurable_fn', stream_fn)()
    except errors.TerraformerError as e:
      raise errors.TerraformerError(f'cell {name}: {e}') from None


def seed_bindings(seed):
  """Gin bindings of one seed: weight init and rngs, and the training
  numbers (the in-distribution and OOD test numbers stay the same)."""
  return [f'terraformer.train.random_seed = {seed}',
          f'train/arithmetic_stream.seed = {seed}']


def run_table(output_dir, cells=DEFAULT_CELLS, config_files=(), bindings=(),
              configure=None, gin_dir=None, seeds=None, table_only=False):
  """Trains and evaluates each cell; writes and returns the table.

  Args:
    output_dir: each cell trains in `<output_dir>/<cell>` (checkpoints,
      TensorBoard events, RESULT_FILE), or with `seeds` in
      `<output_dir>/<cell>_seed<k>`; the table goes to TABLE_JSON and
      TABLE_MD there. Rerunning resumes unfinished cells, skips finished ones.
    cells: cell names (`gin/ood/<name>.gin`) or paths of gin files.
    config_files: gin files parsed after each cell's (e.g. paper_scale.gin).
    bindings: gin bindings applied last, to every cell.
    configure: function(files, bindings) parsing gin; default
      `terraformer.config.parse_gin` (gin/ on the search path).
    gin_dir: folder holding `ood/`; default the repository's gin/.
    seeds: None (one run per cell, the gin seed), or integer seeds: each
      cell runs once per seed (`seed_bindings`, before `bindings`) and the
      table pools the seeds.
    table_only: train nothing: the table of the runs that have a
      RESULT_FILE (whatever config wrote it), the others named as missing.

  Returns:
    (list of per-run result dicts, markdown table).
  """
  from terraformer import config as config_lib  # pylint: disable=g-import-not-at-top
  configure = configure or config_lib.parse_gin
  gin_dir = gin_dir or config_lib.GIN_DIR
  cells = [cell_config_file(c, gin_dir) for c in cells]
  names = [n for n, _ in cells]
  if len(set(names)) != len(names):
    raise errors.TerraformerError(f'duplicate cells: {names}')
  if seeds is not None and (
      not seeds or len(set(seeds)) != len(seeds) or
      any(isinstance(k, bool) or not isinstance(k, int) or k < 0
          for k in seeds)):
    raise errors.TerraformerError(
        f'seeds must be distinct integers >= 0, got {seeds!r}')
  runs = []  # (cell name, run directory name, gin files, bindings)
  for name, path in cells:
    files = [path] + list(config_files or [])
    for seed in ([None] if seeds is None else seeds):
      extra = [] if seed is None else seed_bindings(seed)
      runs.append((name, name if seed is None else f'{name}_seed{seed}',
                   files, extra + list(bindings or [])))
  if table_only:
    results = []
    for _, run_dir, _, _ in runs:
      path = os.path.join(output_dir, run_dir, RESULT_FILE)
      if os.path.isfile(path):
        with open(path) as f:
          results.append(json.load(f))
      else:
        print(f'[{run_dir}] no result yet', flush=True)
    if not results:
      raise errors.TerraformerError(f'no results in {output_dir}')
    return _write_table(output_dir, results)
  try:
    for name, _, files, run_bindings in runs:  # Fail fast, before training.
      configure(files, run_bindings)
      _check_cell(name)
    os.makedirs(output_dir, exist_ok=True)
    results = []
    for name, run_dir, files, run_bindings in runs:
      configure(files, run_bindings)
      results.append(run_cell(name, os.path.join(output_dir, run_dir)))
  finally:
    gin.clear_config()
  return _write_table(output_dir, results)


def _write_table(output_dir, results):
  table = format_table(results)
  _write_json(os.path.join(output_dir, TABLE_JSON), results)
  with open(os.path.join(output_dir, TABLE_MD), 'w') as f:
    f.write(table + '\n')
  return results, table
