"""Scores of the salient-extraction task (Pyramidion's scorer ablation).

The task (`terraformer.data.salient_extraction`): the target is the input's
salient tokens in input order, then EOS. A trained encoder-decoder is
decoded greedily (no teacher forcing; `model_decode`) and scored with:

  token F1      per example, the multiset overlap of the decoded tokens
                before the first EOS and the target's (SQuAD's token F1),
                averaged over examples: what passed the bottleneck, in any
                order;
  exact match   the share of examples decoded exactly (order, length, EOS);
  recall        the share of salient positions among the encoder's first
                pooling's winners (`successive_halving_topk.
                recording_selections`), over all examples ("recall (salient
                or marker)" also counts a salient token whose marker won:
                after a layer the marker may carry it); None without a
                top-k pooling (no pooling, or mean / max windows, which
                select nothing).

`choose_on_validation` picks a run's scored step by validation token F1 and
`scorers_table` makes the experiment's table (`{"columns", "rows"}`, as
tools/results.py records it) from the runs of each row (seeds) and the
memory bench's compiled memory and step time.
"""
import collections
import glob
import json
import os
import re
import statistics

import numpy as np

from terraformer import errors
from terraformer.data import salient_extraction

EVAL_FILE = 'eval_{split}_{step}.json'
MIB = 2.0 ** 20


def until_eos(row, eos_id):
  """The tokens of `row` before its first EOS (all of them without one)."""
  row = np.asarray(row).reshape(-1).tolist()
  return row[:row.index(eos_id)] if eos_id in row else row


def token_f1(predicted, gold):
  """SQuAD's token F1 of two token lists (multisets); 1.0 when both are
  empty, 0.0 when only one is."""
  if not predicted and not gold:
    return 1.0
  common = sum((collections.Counter(predicted)
                & collections.Counter(gold)).values())
  if not common:
    return 0.0
  precision, recall = common / len(predicted), common / len(gold)
  return 2 * precision * recall / (precision + recall)


def selection_hits(kept, salient):
  """(salient positions kept, salient positions kept or whose marker, the
  position before, is kept) for one example: `kept` the first pooling's
  winners, `salient` a bool row of the input's salient positions."""
  where = np.flatnonzero(salient)
  kept = np.asarray(kept)
  hit = np.isin(where, kept)
  return int(hit.sum()), int((hit | np.isin(where - 1, kept)).sum())


def model_decode(predict_model, eos_id):
  """`decode(inputs, target_len)` of `score`: greedy decoding (no teacher
  forcing) with a trained predict-mode encoder-decoder
  (`terraformer.decoding.search.decode`; the encoder runs once)."""
  from terraformer.decoding import search  # pylint: disable=g-import-not-at-top

  def decode(inputs, target_len):
    return np.asarray(search.decode(
        predict_model, inputs, max_length=target_len, method='greedy',
        eos_id=eos_id, pad_id=0, input_length=inputs.shape[1],
        progress=False))

  return decode


def model_winners(eval_model):
  """`winners(inputs, targets)` of `score`: the first pooling's winners
  [B, k] in a trained eval-mode encoder-decoder's forward pass (jitted), or
  None when it has no top-k pooling."""
  import jax  # pylint: disable=g-import-not-at-top
  from terraformer.layers import successive_halving_topk as topk  # pylint: disable=g-import-not-at-top

  def run(inputs, targets, weights, state, rng):
    with topk.recording_selections() as selected:
      eval_model.pure_fn((inputs, targets), weights, state, rng)
    return selected[0] if selected else None

  run = jax.jit(run)

  def winners(inputs, targets):
    kept = run(inputs, targets, eval_model.weights, eval_model.state,
               eval_model.rng)
    return None if kept is None else np.asarray(kept)

  return winners


def score(batches, decode, winners, eos_id, declare_every=None,
          markers_from=None):
  """Token F1, exact match and first-pooling recall over `batches`.

  Args:
    batches: (inputs, targets, weights) of the salient-extraction stream.
    decode: `decode(inputs, target_len)` -> greedy decodes [B, <= target_len]
      (`model_decode`).
    winners: `winners(inputs, targets)` -> the first pooling's winners
      [B, k], or None (`model_winners`).
    eos_id: the vocabulary's EOS.
    declare_every, markers_from: the stream's section length and, with
      indexed markers, its first marker id (which positions are salient:
      `salient_extraction.salient_positions`).

  Returns:
    dict(examples, token_f1, exact_match, recall_salient,
    recall_salient_or_marker); the recalls None without top-k pooling.
  """
  f1 = exact = n = 0
  hits = hits_or_marker = n_salient = 0
  pooled = False
  for inputs, targets, _ in batches:
    decoded = decode(inputs, targets.shape[1])
    kept = winners(inputs, targets)
    pooled = kept is not None
    salient = salient_extraction.salient_positions(inputs, declare_every,
                                                   markers_from)
    for i, (row, gold) in enumerate(zip(decoded, targets)):
      predicted, gold = until_eos(row, eos_id), until_eos(gold, eos_id)
      f1 += token_f1(predicted, gold)
      # Exact: the same tokens, and an EOS after them.
      exact += int(predicted == gold and eos_id in np.asarray(row).tolist())
      n += 1
      if pooled:
        a, b = selection_hits(kept[i], salient[i])
        hits, hits_or_marker = hits + a, hits_or_marker + b
        n_salient += int(salient[i].sum())
  if not n:
    raise errors.TerraformerError('no examples to score')
  recall = (lambda h: h / max(n_salient, 1)) if pooled else (lambda h: None)
  return dict(examples=n, token_f1=f1 / n, exact_match=exact / n,
              recall_salient=recall(hits),
              recall_salient_or_marker=recall(hits_or_marker))


def scored_steps(run_dir, split):
  """{step: evaluation dict} of the `EVAL_FILE`s of one split in run_dir."""
  found = {}
  pattern = os.path.join(run_dir, EVAL_FILE.format(split=split, step='*'))
  for path in glob.glob(pattern):
    step = re.search(r'_(\d+)\.json$', path)
    if step:
      with open(path, encoding='utf-8') as f:
        found[int(step.group(1))] = json.load(f)
  return found


def choose_on_validation(run_dir):
  """(step, test evaluation) of the scored step with the best validation
  token F1 (the earliest of equals); TerraformerError without one."""
  validation = scored_steps(run_dir, 'validation')
  test = scored_steps(run_dir, 'test')
  steps = sorted(set(validation) & set(test))
  if not steps:
    raise errors.TerraformerError(
        f'{run_dir}: no step scored on both validation and test '
        f'({EVAL_FILE.format(split="validation", step="STEP")})')
  best = max(steps, key=lambda s: (validation[s]['token_f1'], -s))
  return best, test[best]


def _cell(values, digits=3):
  """'mean (seed, seed, ...)' of numbers; '-' when there are none."""
  values = [v for v in values if v is not None]
  if not values:
    return '-'
  mean = f'{statistics.mean(values):.{digits}f}'
  if len(values) == 1:
    return mean
  return f'{mean} ({", ".join(f"{v:.{digits}f}" for v in values)})'


def bench_figures(report, model, input_len):
  """(step ms, compiled MiB) of `model` at `input_len` in a
  terraformer-memory-bench --json report; (None, None) if not there."""
  for row in (report or {}).get('models', {}).get(model, []):
    if row['input_len'] == input_len:
      return row.get('step_ms'), row['memory']['total'] / MIB
  return None, None


COLUMNS = ['row', 'token F1', 'exact match', 'recall (salient)',
           'recall (salient or marker)', 'step (ms)', 'memory (MiB)',
           'steps chosen']


def scorers_table(rows, report=None):
  """The experiment's table: `{"columns": COLUMNS, "rows": [...]}`.

  Args:
    rows: (label, bench model name or None, input length, run dirs) per
      row; each run's test scores at its step chosen on validation, the
      mean over runs (seeds) and each run's value; no runs: '-'.
    report: terraformer-memory-bench --json output (step ms, memory).
  """
  table = []
  for label, model, input_len, run_dirs in rows:
    chosen = [choose_on_validation(d) for d in run_dirs]
    tests = [t for _, t in chosen]
    ms, mib = bench_figures(report, model, input_len)
    table.append([
        label,
        _cell([t['token_f1'] for t in tests]),
        _cell([t['exact_match'] for t in tests]),
        _cell([t['recall_salient'] for t in tests]),
        _cell([t['recall_salient_or_marker'] for t in tests]),
        '-' if ms is None else f'{ms:.0f}',
        '-' if mib is None else f'{mib:.1f}',
        ', '.join(str(s) for s, _ in chosen) or '-'])
  return dict(columns=list(COLUMNS), rows=table)
