"""Evaluation helpers: sentences, ROUGE, examples, perplexity, baselines.

The end-to-end `evaluate` runs on a trained checkpoint in
tests/cli/test_cli_eval.py.
"""
import os
import re
import sys

import jax
import numpy as np
import pytest
from rouge_score import rouge_scorer
from trax import shapes

from terraformer.decoding import search as decoding
from terraformer import errors
from terraformer.evaluation import rouge as evaluation
from terraformer.data import aclsum_papers
from terraformer.models import ScalingTransformer


@pytest.mark.parametrize('text, sentences', [
    ('We use sparse layers. They work! Do they scale? Yes.',
     ['We use sparse layers.', 'They work!', 'Do they scale?', 'Yes.']),
    ('As in Fig. 3 and e.g. Table 2, see Jaszczur et al. 2021. Next one.',
     ['As in Fig. 3 and e.g. Table 2, see Jaszczur et al. 2021.',
      'Next one.']),
    ('Line one\nLine two. "Quoted" start.',
     ['Line one', 'Line two.', '"Quoted" start.']),
    ('Written by J. Smith. Done.', ['Written by J. Smith.', 'Done.']),
    ('Values are 3.5 and 0.25. lower case does not start one.',
     ['Values are 3.5 and 0.25. lower case does not start one.']),
    ('  \n', []),
])
def test_simple_sentences(text, sentences):
  assert evaluation.simple_sentences(text) == sentences


def test_split_sentences_uses_nltk_only_when_available(monkeypatch):
  monkeypatch.setattr(evaluation, '_nltk_sentences', lambda: None)
  assert evaluation.split_sentences('Alpha beta. Gamma delta.') == [
      'Alpha beta.', 'Gamma delta.']
  assert evaluation.sentence_splitter_name() == 'simple (regex)'
  monkeypatch.setattr(evaluation, '_nltk_sentences',
                      lambda: lambda line: line.split(' | '))
  assert evaluation.split_sentences('a | b\nc') == ['a', 'b', 'c']
  assert evaluation.sentence_splitter_name() == 'nltk.punkt'


def test_rouge_scores_match_rouge_score():
  reference = ('Sparse layers are enough. They match dense perplexity. '
               'Decoding is faster.')
  prediction = 'Decoding is faster with sparse layers. They are enough.'
  scores = evaluation.rouge_scores(prediction, reference)
  scorer = rouge_scorer.RougeScorer(list(evaluation.ROUGE_TYPES),
                                    use_stemmer=True)
  direct = scorer.score(
      'Sparse layers are enough.\nThey match dense perplexity.\n'
      'Decoding is faster.',
      'Decoding is faster with sparse layers.\nThey are enough.')
  for name in evaluation.ROUGE_TYPES:
    assert scores[name] == pytest.approx(direct[name].fmeasure, abs=1e-12)
  # Summary-level LCS (per sentence) credits the reordered sentences more
  # than one LCS over the whole text does.
  assert scores['rougeLsum'] > scores['rougeL']
  assert evaluation.rouge_scores(reference, reference)['rouge2'] == 1.0


def test_rouge_without_its_package_is_one_line(monkeypatch):
  """rouge-score is setup.py's `eval` extra: every program registers this
  module's gin names, only scoring needs the package, and says so."""
  monkeypatch.setitem(sys.modules, 'rouge_score', None)  # Not installed.
  with pytest.raises(errors.TerraformerError,
                     match=r'^ROUGE needs the rouge-score package: .*eval'):
    evaluation.rouge_scores('Sparse is enough.', 'Sparse is enough.')


def test_paper_pairs_are_body_abstract_of_the_split():
  papers = aclsum_papers.load_split('validation')
  pairs = evaluation.paper_pairs('validation')
  assert pairs == [(p['body'], p['abstract']) for p in papers]


def test_examples_accepts_pairs_and_dicts():
  pairs = lambda split: iter([('a', 'b'), {'article': 'c', 'abstract': 'd'},
                              {'body': 'e', 'abstract': 'f'}])
  examples = evaluation._examples  # pylint: disable=protected-access
  assert examples(pairs, 'test', None) == [('a', 'b'), ('c', 'd'),
                                           ('e', 'f')]
  assert examples(pairs, 'test', 2) == [('a', 'b'), ('c', 'd')]
  with pytest.raises(errors.TerraformerError, match='no examples'):
    examples(lambda split: [], 'test', None)


VOCAB = 30
TINY = dict(input_vocab_size=VOCAB, d_model=16, d_ff=32, n_heads=2,
            n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=32,
            d_lowrank=4, ff_sparsity=4, attention_sparsity=2,
            loss_sparsity=2)


def _eval_model(seed=0, length=8):
  model = ScalingTransformer(mode='eval', **TINY)
  sig = (shapes.ShapeDtype((1, length), np.int32),) * 2
  model.init(sig, rng=jax.random.PRNGKey(seed))
  return model


def test_reference_log_probs_per_example():
  model = _eval_model()
  rng = np.random.RandomState(0)
  inputs = rng.randint(2, VOCAB, (3, 8)).astype(np.int32)
  targets = rng.randint(2, VOCAB, (3, 6)).astype(np.int32)
  weights = np.ones((3, 6), np.float32)
  weights[1, 4:] = 0.0  # A shorter reference.
  targets[1, 4:] = 0
  nll, counts = evaluation.reference_log_probs(model, inputs, targets,
                                               weights, batch_size=2)
  assert counts.tolist() == [6, 4, 6]
  for i in range(3):  # One example at a time, by hand.
    logits = np.asarray(model((inputs[i:i + 1], targets[i:i + 1]))[0])[0]
    log_p = decoding._log_softmax(logits)  # pylint: disable=protected-access
    n = int(counts[i])
    expected = -sum(log_p[t, targets[i, t]] for t in range(n))
    assert nll[i] == pytest.approx(expected, rel=1e-5)


# --- Extractive baselines -----------------------------------------------------

ARTICLE = ('Sparse layers cut decoding time. They keep the perplexity of '
           'dense models. We test them on long documents. The code is '
           'public. Results follow in Section 4.')
REFERENCE = ('Sparse layers keep the perplexity of dense models and cut '
             'decoding time on long documents.')


def test_lead_3_is_the_first_three_sentences_scored_by_rouge_score():
  lead = evaluation.lead_sentences(ARTICLE, 3)
  assert lead.splitlines() == [
      'Sparse layers cut decoding time.',
      'They keep the perplexity of dense models.',
      'We test them on long documents.']
  summary, rows = evaluation.extractive_baselines([(ARTICLE, REFERENCE)])
  scorer = rouge_scorer.RougeScorer(list(evaluation.ROUGE_TYPES),
                                    use_stemmer=True)
  direct = scorer.score(
      REFERENCE,  # One sentence.
      'Sparse layers cut decoding time.\nThey keep the perplexity of dense '
      'models.\nWe test them on long documents.')
  for name in evaluation.ROUGE_TYPES:
    assert rows[0]['lead_3'][name] == pytest.approx(direct[name].fmeasure,
                                                    abs=1e-12)
    assert summary['lead_3'][name] == rows[0]['lead_3'][name]
  # By hand: 15 reference words, 18 in lead-3; shared unigrams (stemmed):
  # sparse layers cut decoding time keep the perplexity of dense models on
  # long documents = 14.
  assert summary['lead_3']['rouge1'] == pytest.approx(2 * 14 / (15 + 18))
  assert summary["lead_3"]["words"] == 18
  assert summary['lead_3']['sentences'] == 3


def test_lead_matched_picks_the_k_closest_in_words():
  article = 'One two three four. Five six seven eight. Nine ten eleven twelve.'
  assert evaluation.lead_matched(article, ' '.join(['w'] * 9)) == (
      'One two three four.\nFive six seven eight.', 2)  # 8 words vs 12.
  assert evaluation.lead_matched(article, ' '.join(['w'] * 10)) == (
      'One two three four.\nFive six seven eight.', 2)  # A tie: smaller k.
  assert evaluation.lead_matched(article, 'w')[1] == 1
  assert evaluation.lead_matched(article, ' '.join(['w'] * 50))[1] == 3
  summary, _ = evaluation.extractive_baselines(
      [(article, ' '.join(['w'] * 9)), (article, 'w')])
  assert summary['lead_matched']['sentences'] == 1.5
  assert summary['lead_matched']['words'] == 6.0


def _synthetic_test_papers(tmp_path):
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'data',
                      'synthetic_papers.py')
  spec = importlib.util.spec_from_file_location('synthetic_papers', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  module.make_corpus(str(tmp_path), {'train': 0, 'validation': 0, 'test': 4})
  return evaluation.paper_pairs('test', papers_dir=str(tmp_path))


def test_baselines_on_synthetic_papers(tmp_path):
  pairs = _synthetic_test_papers(tmp_path)
  assert len(pairs) == 4
  summary, rows = evaluation.extractive_baselines(pairs, k=3, seed=0)
  assert set(summary) == {'lead_3', 'lead_matched', 'random_3'}
  scorer = rouge_scorer.RougeScorer(['rouge2'], use_stemmer=True)
  for (body, abstract), row in zip(pairs, rows):
    # The generator writes sentences 'Word word ... word.' joined by spaces
    # or newlines.
    sentences = re.split(r'(?<=\.)\s+', body.strip())
    assert evaluation.lead_sentences(body, 3).splitlines() == sentences[:3]
    assert row['lead_3']['rouge2'] == pytest.approx(
        scorer.score(abstract, '\n'.join(sentences[:3]))['rouge2'].fmeasure)
    picked = evaluation.random_sentences(body, 3, seed=0, index=0)
    indices = [sentences.index(s) for s in picked.splitlines()]
    assert len(indices) == 3 and indices == sorted(set(indices))
  assert summary['random_3']['rouge2'] == pytest.approx(
      np.mean([r['random_3']['rouge2'] for r in rows]))
  # The random draw is fixed by (seed, index), and the seed matters.
  body = pairs[0][0]
  draws = {evaluation.random_sentences(body, 3, seed, 0) for seed in range(5)}
  assert evaluation.random_sentences(body, 3, 0, 0) == (
      evaluation.random_sentences(body, 3, 0, 0))
  assert len(draws) > 1
  again, _ = evaluation.extractive_baselines(pairs[1:], k=3, seed=0)
  assert again['random_3'] != summary['random_3'] or len(pairs) == 1
  assert evaluation.random_sentences('Only one.', 3, 0, 0) == 'Only one.'
