"""Summarization evaluation (§4.4, Table 5): decode a split, score ROUGE.

`evaluate` (gin: `terraformer.evaluate`) loads the checkpoint that
`terraformer-train` wrote, decodes the articles of a split with the
predict-mode model (by default the paper's setting: one left-to-right pass at
temperature 0.5, see `terraformer.decoding.search`), and reports

  * ROUGE-1, ROUGE-2, ROUGE-LSum (summary level: longest common subsequences
    over sentences, one sentence per line) and ROUGE-L (sentence level: the
    whole text as one sequence) F1, by the `rouge-score` package (the paper's
    footnotes 4, 5), averaged over examples; the paper reports only F1;
  * the log-perplexity (nats per token) of the reference abstracts under the
    eval-mode model, teacher-forced, over all target tokens;
  * beside the model, the extractive yardsticks of summarization papers,
    scored on the same examples by the same scorer (`extractive_baselines`):
    lead-3 (the first 3 sentences of the article), lead-k matched (the first
    k sentences, k per example so that their word count is closest to the
    reference's) and 3 random sentences of the article (fixed seed);
  * fluency (`terraformer.evaluation.fluency`) of the generated summaries and,
    as their yardstick, of the references: the shares of their words and
    word trigrams that occur in the training split's texts, and the share of
    repeated trigrams (frequent-word salad has known words, unknown trigrams).

It writes one JSON line per example and a summary JSON into the checkpoint
directory. The vocabulary and the checkpoint come from `terraformer.loading`.
"""
import dataclasses
import itertools
import json
import logging
import os
import re
import time

import gin
import jax
import jax.numpy as jnp
import numpy as np
from trax import shapes
import tqdm

from terraformer import config
from terraformer.decoding import search as decoding
from terraformer import errors
from terraformer.data import aclsum_papers
from terraformer.evaluation import fluency as fluency_lib
from terraformer.loading import model as loading_model
from terraformer.loading import vocab as loading_vocab

ROUGE_TYPES = ('rouge1', 'rouge2', 'rougeLsum', 'rougeL')


# --- Examples ---------------------------------------------------------------

@gin.configurable(module='terraformer')
def paper_pairs(split='test', papers_dir=None):
  """(body, abstract) pairs of the offline aclsum papers of `split`."""
  return [(p['body'], p['abstract'])
          for p in aclsum_papers.load_split(split, papers_dir)]


def _examples(examples_fn, split, max_examples):
  pairs = []
  for pair in itertools.islice(examples_fn(split=split), max_examples):
    if isinstance(pair, dict):
      pair = (pair.get('article', pair.get('body')), pair['abstract'])
    pairs.append((str(pair[0]), str(pair[1])))
  if not pairs:
    raise errors.TerraformerError(f'split {split!r} has no examples')
  return pairs


def _fluency(examples_fn, split, max_examples, predictions, references):
  """{'model': ..., 'references': ..., 'split': ...}: `fluency.Fluency` dicts
  of the predictions and the references against `split`'s texts."""
  training = fluency_lib.TrainingText(itertools.chain.from_iterable(
      _examples(examples_fn, split, max_examples)))
  return {'model': dataclasses.asdict(training.fluency(predictions)),
          'references': dataclasses.asdict(training.fluency(references)),
          'split': split}


# --- ROUGE ------------------------------------------------------------------

def _nltk_sentences():
  """nltk's Punkt sentence splitter if its data is installed, else None."""
  try:
    import nltk  # pylint: disable=g-import-not-at-top
    nltk.data.find('tokenizers/punkt_tab/english/')  # sent_tokenize's data.
    return nltk.sent_tokenize
  except (ImportError, LookupError):
    return None


# A sentence ends at . ! or ? followed by whitespace and an upper-case letter,
# a digit or an opening quote/bracket; common abbreviations do not end one.
_ABBREVIATIONS = ('e.g', 'i.e', 'al', 'etc', 'vs', 'cf', 'fig', 'eq',
                  'sec', 'tab', 'no', 'dr', 'mr', 'mrs', 'ms', 'prof', 'approx')
_BOUNDARY = re.compile(r'(?<=[.!?])["\')\]]?\s+(?=["\'(\[]?[A-Z0-9])')


def simple_sentences(text):
  """Splits `text` into sentences (newlines always split).

  The offline fallback of `split_sentences` when nltk's Punkt data is not
  installed: a break after '.', '!' or '?' followed by whitespace and an
  upper-case letter or digit, except after common abbreviations (e.g., et
  al., Fig.).
  """
  sentences = []
  for line in text.splitlines():
    start = 0
    for match in _BOUNDARY.finditer(line):
      before = line[start:match.start()].rstrip('"\')]').rstrip('.!?')
      last_word = before.split()[-1].lower() if before.split() else ''
      if last_word in _ABBREVIATIONS or re.fullmatch(r'[a-z]', last_word):
        continue
      sentences.append(line[start:match.start()].strip())
      start = match.end()
    sentences.append(line[start:].strip())
  return [s for s in sentences if s]


def split_sentences(text):
  """Sentences of `text`: nltk Punkt if available offline, else simple."""
  splitter = _nltk_sentences()
  if splitter is None:
    return simple_sentences(text)
  return [s for line in text.splitlines() for s in splitter(line) if s]


def sentence_splitter_name():
  return 'nltk.punkt' if _nltk_sentences() else 'simple (regex)'


def new_scorer(use_stemmer=True):
  """`rouge-score`'s scorer of `ROUGE_TYPES`.

  Imported here, not with the module: every program that reads gin files
  registers `terraformer.evaluate` (this module), and only scoring needs the
  package (setup.py's `eval` extra).
  """
  try:
    from rouge_score import rouge_scorer as scorer_lib  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise errors.TerraformerError(
        'ROUGE needs the rouge-score package: pip install -e ".[eval]"'
    ) from None
  return scorer_lib.RougeScorer(list(ROUGE_TYPES), use_stemmer=use_stemmer)


def rouge_scores(prediction, reference, use_stemmer=True):
  """ROUGE-1/2/LSum/L F1 of one example, by `rouge-score`.

  Both texts are split into sentences, one per line, which only ROUGE-LSum
  uses (the other types tokenize the whole text).
  """
  scorer = new_scorer(use_stemmer)
  scores = scorer.score('\n'.join(split_sentences(reference)),
                        '\n'.join(split_sentences(prediction)))
  return {name: scores[name].fmeasure for name in ROUGE_TYPES}


# --- Extractive baselines ----------------------------------------------------

def word_count(text):
  """Words of `text` (whitespace-separated), the length lead-k matches."""
  return len(text.split())


def lead_sentences(article, k):
  """The first `k` sentences of `article` (`split_sentences`), one per line."""
  return '\n'.join(split_sentences(article)[:k])


def lead_matched(article, reference):
  """The first k sentences of `article`, k >= 1 chosen so that their word
  count is closest to the reference's (the smaller k on a tie).

  Returns (text, k).
  """
  target = word_count(reference)
  sentences = split_sentences(article)
  best_k, best_gap, words = 1, None, 0
  for k, sentence in enumerate(sentences, 1):
    words += word_count(sentence)
    gap = abs(words - target)
    if best_gap is None or gap < best_gap:
      best_k, best_gap = k, gap
    if words >= target:  # Longer prefixes only move further away.
      break
  return '\n'.join(sentences[:best_k]), best_k


def random_sentences(article, k, seed, index):
  """`k` sentences of `article` drawn without replacement, in article order.

  The draw of example `index` depends only on (seed, index), so a different
  `max_examples` keeps each example's sentences.
  """
  sentences = split_sentences(article)
  rng = np.random.default_rng([seed, index])
  picked = sorted(rng.choice(len(sentences), min(k, len(sentences)),
                             replace=False)) if sentences else []
  return '\n'.join(sentences[i] for i in picked)


def extractive_baselines(pairs, k=3, seed=0, use_stemmer=True):
  """Lead-k, lead-k matched and k random sentences of each article, scored
  against its reference like the model's summaries (`rouge_scores`).

  Args:
    pairs: (article, reference) texts.
    k: sentences of lead-k and of the random baseline.
    seed: seed of the random baseline.
    use_stemmer: as `rouge_scores`.

  Returns:
    (summary, rows): summary maps each baseline name ('lead_3',
    'lead_matched', 'random_3' for k=3) to its mean ROUGE F1s, mean words
    and mean sentences; rows holds per example {name: {ROUGE F1s, 'words',
    'sentences'}}.
  """
  rows = []
  for i, (article, reference) in enumerate(pairs):
    matched, matched_k = lead_matched(article, reference)
    texts = {f'lead_{k}': lead_sentences(article, k),
             'lead_matched': matched,
             f'random_{k}': random_sentences(article, k, seed, i)}
    rows.append({
        name: {**rouge_scores(text, reference, use_stemmer),
               'words': word_count(text),
               'sentences': (matched_k if name == 'lead_matched'
                             else len(text.splitlines()))}
        for name, text in texts.items()})
  summary = {name: {key: float(np.mean([r[name][key] for r in rows]))
                    for key in rows[0][name]}
             for name in rows[0]} if rows else {}
  return summary, rows


# --- Perplexity ---------------------------------------------------------------

def reference_log_probs(eval_model, inputs, targets, weights, batch_size):
  """Per-example (sum of -log p, number of tokens) of the targets.

  Teacher-forced: `eval_model((inputs, targets))` gives the logits of every
  target position at once (the model shifts the targets right).
  """
  forward = jax.jit(eval_model.pure_fn)
  nll, counts = [], []
  for start in range(0, len(inputs), batch_size):
    rows = slice(start, start + batch_size)
    x, y, w = inputs[rows], targets[rows], weights[rows]
    n = len(x)
    if n < batch_size:  # Same shapes for every batch: one compilation.
      fill = lambda a: np.concatenate([a, np.repeat(a[:1], batch_size - n, 0)])
      x, y, w = fill(x), fill(y), fill(w)
    outputs, _ = forward((jnp.asarray(x), jnp.asarray(y)), eval_model.weights,
                         eval_model.state, eval_model.rng)
    logits = np.asarray(outputs[0], np.float64)
    log_p = decoding._log_softmax(logits)  # pylint: disable=protected-access
    token_log_p = np.take_along_axis(log_p, y[..., None], axis=-1)[..., 0]
    nll += list(-(token_log_p * w).sum(axis=1)[:n])
    counts += list(w.sum(axis=1)[:n])
  return np.array(nll), np.array(counts)


# --- evaluate ---------------------------------------------------------------

def _pad_rows(rows, length):
  out = np.zeros((len(rows), length), np.int32)
  weights = np.zeros((len(rows), length), np.float32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
    weights[i, :len(r)] = 1.0
  return out, weights


@gin.configurable(module='terraformer')
def evaluate(output_dir, model=None, examples_fn=paper_pairs, split='test',
             max_examples=None, input_len=None, max_length=None,
             method='sample', temperature=0.5, top_k=0, top_p=1.0,
             beam_size=4, length_penalty=0.0, no_repeat_ngram=0, seed=0,
             batch_size=8, use_stemmer=True, baselines=True, baseline_k=3,
             baseline_seed=0, fluency=True, fluency_split='train',
             fluency_max_examples=10000, progress=True):
  """Decodes a summarization split and scores it; writes JSONL + JSON.

  Args:
    output_dir: directory of the checkpoint (`model.pkl.gz`); the results go
      there too: `eval_{split}_step{step}.jsonl` (one line per example:
      article start, reference, prediction, ROUGE F1s, log-perplexity) and
      `eval_{split}_step{step}.json` (the summary, also returned).
    model: model function taking `mode=`; default `terraformer.train.model`.
    examples_fn: function `(split=...) -> iterable of (article, abstract)`
      text pairs, e.g. `@terraformer.data.summarization_pairs`; default the
      offline aclsum papers (`paper_pairs`, body -> abstract).
    split: split passed to `examples_fn`.
    max_examples: evaluate only the first N examples.
    input_len: encoder input length: articles are tokenized, EOS appended and
      cut to this length, as in training; default the bound
      `summarization_stream`/`seq2seq_stream`/`c4_stream.input_len`, else the
      model's maximum length.
    max_length: most decoded tokens; default the bound `target_len` of those
      streams, else 256. Also the reference length for the perplexity.
    method, temperature, top_k, top_p, beam_size, length_penalty,
    no_repeat_ngram, seed: see
      `terraformer.decoding.search.decode`; the default is the paper's "greedy
      decoding with temperature 0.5" (sampling at T=0.5, seed 0); use
      method='greedy' for the argmax.
    batch_size: examples decoded (and scored) together.
    use_stemmer: ROUGE with Porter stemming (as the rouge-score scripts and
      the usual arXiv setups).
    baselines: also score the extractive baselines (`extractive_baselines`:
      lead-`baseline_k`, lead-k matched, `baseline_k` random sentences with
      `baseline_seed`) on the same examples: summary['baselines'] and each
      JSONL row's 'baselines'.
    baseline_k, baseline_seed: see `baselines`.
    fluency: also measure the fluency of the predictions and references
      against the texts (articles and abstracts) of the first
      `fluency_max_examples` examples of `fluency_split`: summary['fluency'].
    progress: tqdm progress bars.

  Returns:
    The summary dict: mean ROUGE F1s (0..1), log_perplexity (nats/token),
    perplexity, counts, settings and file paths.
  """
  started = time.time()
  output_dir = os.path.expanduser(output_dir)
  loading_model.checkpoint_path(output_dir)
  new_scorer(use_stemmer)  # Before decoding: the scorer's package is there.
  model_fn = model or config.model_from_config()
  vocab = loading_vocab.text_vocab()
  bound_input, bound_target = loading_vocab.training_lengths()
  pairs = _examples(examples_fn, split, max_examples)

  probe = model_fn(mode='predict')
  if not decoding.is_encoder_decoder(probe):
    raise errors.TerraformerError(
        'terraformer-eval needs an encoder-decoder model ((inputs, targets) '
        f'-> logits); {getattr(model_fn, "__name__", model_fn)} is a '
        'decoder-only LM')
  limit = decoding.model_max_length(probe)
  input_len = input_len or bound_input or limit
  if not input_len:
    raise errors.TerraformerError(
        'set terraformer.evaluate.input_len (no input length is bound)')
  if limit and input_len > limit:
    raise errors.TerraformerError(
        f'input_len={input_len} exceeds the model\'s maximum length {limit}')
  max_length = max_length or bound_target or 256

  inputs, n_cut = [], 0
  for article, _ in pairs:
    ids, cut = loading_vocab.encode_input(vocab, article, input_len)
    inputs.append(ids)
    n_cut += bool(cut)
  if n_cut:
    logging.info('%d of %d articles truncated to %d tokens', n_cut,
                 len(pairs), input_len)

  predict_sig = (shapes.ShapeDtype((batch_size, input_len), np.int32),
                 shapes.ShapeDtype((batch_size, 1), np.int32))
  predict_model, step = loading_model.load_model(
      model_fn, output_dir, 'predict', predict_sig)
  decode_start = time.time()
  outputs = decoding.decode_batches(
      predict_model, inputs, batch_size=batch_size, progress=progress,
      max_length=max_length, method=method, temperature=temperature,
      top_k=top_k, top_p=top_p, beam_size=beam_size,
      length_penalty=length_penalty, no_repeat_ngram=no_repeat_ngram,
      eos_id=vocab.eos_id, seed=seed,
      input_length=input_len)
  decode_seconds = time.time() - decode_start
  predictions = [loading_vocab.detokenize(vocab, ids) for ids in outputs]

  references = [abstract for _, abstract in pairs]
  target_rows = [(list(vocab.encode(r)) + [vocab.eos_id])[:max_length]
                 for r in references]
  enc, _ = _pad_rows(inputs, input_len)
  targets, weights = _pad_rows(target_rows, max_length)
  eval_sig = (shapes.ShapeDtype((batch_size, input_len), np.int32),
              shapes.ShapeDtype((batch_size, max_length), np.int32))
  eval_model = loading_model.with_weights(  # Same weights in every mode.
      model_fn(mode='eval'), predict_model.weights, eval_sig)
  nll, counts = reference_log_probs(eval_model, enc, targets, weights,
                                    batch_size)

  scores = [rouge_scores(p, r, use_stemmer) for p, r in tqdm.tqdm(
      zip(predictions, references), total=len(pairs), desc='ROUGE',
      unit='ex', disable=not progress, leave=False)]

  baseline_summary, baseline_rows = (
      extractive_baselines(pairs, baseline_k, baseline_seed, use_stemmer)
      if baselines else ({}, [{}] * len(pairs)))

  fluency_summary = (
      _fluency(examples_fn, fluency_split, fluency_max_examples, predictions,
               references) if fluency else {})

  base = os.path.join(output_dir, f'eval_{split}_step{step}')
  with open(base + '.jsonl', 'w', encoding='utf-8') as f:
    for i, ((article, reference), prediction, score, baseline) in enumerate(
        zip(pairs, predictions, scores, baseline_rows)):
      f.write(json.dumps({
          'index': i, 'article_start': article[:200], 'reference': reference,
          'prediction': prediction, 'n_input_tokens': len(inputs[i]),
          'n_output_tokens': len(outputs[i]),
          'log_perplexity': nll[i] / max(counts[i], 1),
          'n_reference_tokens': int(counts[i]), **score,
          'prediction_words': word_count(prediction),
          'reference_words': word_count(reference),
          **({'baselines': baseline} if baselines else {})}) + '\n')
  log_ppl = float(nll.sum() / counts.sum())
  n_tokens = int(sum(len(o) for o in outputs))
  summary = {
      **{name: float(np.mean([s[name] for s in scores]))
         for name in ROUGE_TYPES},
      'log_perplexity': log_ppl,
      'perplexity': float(np.exp(min(log_ppl, 50.0))),
      'n_examples': len(pairs), 'n_inputs_truncated': n_cut,
      'n_decoded_tokens': n_tokens,
      'decode_seconds': decode_seconds,
      'seconds_per_token': decode_seconds / max(n_tokens, 1),
      'total_seconds': time.time() - started,
      'step': step, 'split': split, 'input_len': input_len,
      'max_length': max_length, 'method': method,
      'temperature': temperature if method == 'sample' else None,
      'top_k': top_k, 'top_p': top_p,
      'beam_size': beam_size if method == 'beam' else None,
      'length_penalty': length_penalty if method == 'beam' else None,
      'no_repeat_ngram': no_repeat_ngram, 'seed': seed, 'batch_size': batch_size, 'use_stemmer': use_stemmer,
      'sentence_splitter': sentence_splitter_name(),
      'prediction_words': float(np.mean([word_count(p) for p in predictions])),
      'reference_words': float(np.mean([word_count(r) for r in references])),
      'baselines': baseline_summary,
      'fluency': fluency_summary,
      'baseline_k': baseline_k if baselines else None,
      'baseline_seed': baseline_seed if baselines else None,
      'examples_jsonl': base + '.jsonl', 'summary_json': base + '.json',
  }
  with open(base + '.json', 'w', encoding='utf-8') as f:
    json.dump(summary, f, indent=2)
  return summary
