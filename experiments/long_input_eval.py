"""Exact match and token accuracy of a trained long-range recall model.

  PYTHONPATH=. .venv/bin/python experiments/long_input_eval.py \
    --config_file=gin/long_input/full.gin --output_dir=RUN_DIR [--batches=16]

Loads the run's last checkpoint, reads `--batches` batches of the gin eval
stream (the validation split; the first ones, as `terraformer-train`'s eval)
and scores the teacher-forced argmax on the weighted target tokens (an
encoder-decoder's target, or a causal LM's answer tokens). An example is an
exact match when every weighted target token (values and EOS) is right; teacher-forced exact match equals
greedy decoding's, since with every prefix right greedy decoding sees the
same prefixes. Prints one JSON line.

`--kept_by_pooling` (pooled encoders) adds which input tokens win the
encoder's first pooling (successive halving top-k): the fraction of the
facts' tokens (task symbols in the first half of the input), of the query
tokens (task symbols in the second half) and of examples that keep all of
them; task symbols are the ids >= `long_range_recall_stream.vocab_size`.

`--by_key_position` (encoder-decoder recall with `link='adjacent'`, facts
`K_j V_j` in the first half, queries `Q K_q1 ... K_qk` before the final EOS)
adds the teacher-forced accuracy of each answer value by the input position
of its queried key: which distances from the queries (27-31 at 32 tokens) a
model bridges, so which of an encoder's branches can have carried a fact
(a local window relays only the keys it, stacked, reaches).
"""
import inspect
import itertools
import json
import sys

from absl import app
from absl import flags
import gin
import numpy as np

from terraformer import config
from terraformer.cli import common

FLAGS = flags.FLAGS
flags.DEFINE_multi_string('config_file', [], 'Gin files.')
flags.DEFINE_multi_string('config', [], 'Gin bindings.')
flags.DEFINE_string('output_dir', None, 'Run directory (checkpoint).')
flags.DEFINE_integer('batches', 16, 'Eval batches to score.')
flags.DEFINE_bool('kept_by_pooling', False,
                  'Also report which tokens the first pooling keeps.')
flags.DEFINE_bool('by_key_position', False,
                  "Also report the values' accuracy by their key's position "
                  "(link='adjacent' recall).")


def _reference(name):
  ref = gin.query_parameter(name)
  return ref.scoped_configurable_fn


def _stream_parameter(arg):
  """long_range_recall_stream's `arg` as gin binds it, else its default."""
  from terraformer.data import long_range_recall  # pylint: disable=g-import-not-at-top
  from terraformer.loading import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  value = vocab_lib.gin_binding(f'long_range_recall_stream.{arg}',
                                scopes=('eval/', ''))
  if value is None:  # Not bound.
    return inspect.signature(long_range_recall.long_range_recall_stream
                             ).parameters[arg].default
  return value


def main(argv):
  del argv
  common.setup()  # compat fixes and gin configurables, before Trax is used
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trax import shapes  # pylint: disable=g-import-not-at-top
  from terraformer.loading import model as loading_model  # pylint: disable=g-import-not-at-top
  config.parse_gin(FLAGS.config_file, FLAGS.config)
  model_fn = _reference('terraformer.train.model')
  stream = iter(_reference('terraformer.train.eval_stream')())
  batches = list(itertools.islice(stream, FLAGS.batches))
  x, y, w = batches[0]
  lm = model_fn(mode='eval').n_in == 1  # A causal LM reads the tokens only.
  signature = (shapes.ShapeDtype(x.shape, x.dtype),
               shapes.ShapeDtype(y.shape, y.dtype))
  signature = signature[0] if lm else signature
  model, step = loading_model.load_model(model_fn, FLAGS.output_dir, 'eval',
                                         signature)
  forward = jax.jit(model.pure_fn)
  correct = total = exact = n = 0
  by_position = {}
  for x, y, w in batches:
    inputs = jnp.asarray(x) if lm else (jnp.asarray(x), jnp.asarray(y))
    outputs, _ = forward(inputs, model.weights, model.state, model.rng)
    logits = outputs if lm else outputs[0]
    pred = np.asarray(logits).argmax(-1)
    right = (pred == y) | (w == 0)
    correct += int(((pred == y) * w).sum())
    total += int(w.sum())
    exact += int(right.all(axis=1).sum())
    n += len(x)
    if FLAGS.by_key_position:
      if lm:
        raise SystemExit('--by_key_position: an encoder-decoder recall model '
                         'only')
      _count_by_key_position(x, y, pred, by_position)
  result = dict(output_dir=FLAGS.output_dir, step=int(step), examples=n,
                exact_match=exact / n, token_accuracy=correct / total)
  if FLAGS.by_key_position:
    result['value_accuracy_by_key_position'] = {
        str(p): hits / count for p, (hits, count) in sorted(by_position.items())}
    result['values_by_key_position'] = {
        str(p): count for p, (_, count) in sorted(by_position.items())}
  if FLAGS.kept_by_pooling:
    result.update(_kept_by_first_pooling(model, batches))
  print(json.dumps(result))


def _count_by_key_position(x, y, pred, counts):
  """Adds (right, all) answer values per queried key's input position."""
  if _stream_parameter('link') != 'adjacent':
    raise SystemExit("--by_key_position: link='adjacent' recall only")
  if _stream_parameter('value_len') != 1:
    raise SystemExit('--by_key_position: values of one token only')
  if _stream_parameter('keyed_answer'):
    raise SystemExit('--by_key_position: the values-only form only')
  k = _stream_parameter('n_facts')
  input_len = x.shape[1]
  first_query = input_len - k - 1  # Q K_q1 ... K_qk EOS at the end.
  for tokens, target, guess in zip(x, y, pred):
    for j in range(k):
      key = tokens[first_query + j]
      (where,) = np.flatnonzero(tokens[:input_len // 2] == key)
      hits, count = counts.get(int(where), (0, 0))
      counts[int(where)] = (hits + int(guess[j] == target[j]), count + 1)


def _kept_by_first_pooling(model, batches):
  """Fractions of fact and query tokens among the first pooling's winners."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from terraformer.layers import successive_halving_topk as topk  # pylint: disable=g-import-not-at-top
  symbols = _stream_parameter('vocab_size')
  winners, original = [], topk.successive_halving_topk

  def recording(*args, **kwargs):
    out = original(*args, **kwargs)
    winners.append(np.asarray(out[3]))
    return out

  facts = queries = all_kept = n_facts = n_queries = n = 0
  topk.successive_halving_topk = recording
  try:
    for x, y, _ in batches:
      del winners[:]
      model.pure_fn((jnp.asarray(x), jnp.asarray(y)), model.weights,
                    model.state, model.rng)  # Eager: the winners are arrays.
      if not winners:
        raise SystemExit('--kept_by_pooling: the model has no pooling')
      half = x.shape[1] // 2
      for tokens, kept in zip(x, winners[0]):
        is_symbol = tokens >= symbols
        wanted = np.flatnonzero(is_symbol)
        hit = np.isin(wanted, kept)
        facts += int(hit[wanted < half].sum())
        queries += int(hit[wanted >= half].sum())
        n_facts += int((wanted < half).sum())
        n_queries += int((wanted >= half).sum())
        all_kept += int(hit.all())
        n += 1
  finally:
    topk.successive_halving_topk = original
  return dict(first_pooling_keeps_facts=facts / max(n_facts, 1),
              first_pooling_keeps_queries=queries / max(n_queries, 1),
              first_pooling_keeps_all=all_kept / n)


if __name__ == '__main__':
  sys.exit(app.run(main))
