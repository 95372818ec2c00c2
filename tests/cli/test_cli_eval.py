"""terraformer-eval on a tiny trained enc-dec: ROUGE, perplexity, files."""
import json
import os

import numpy as np
import pytest
from rouge_score import rouge_scorer

import tiny_checkpoints
from terraformer.evaluation import rouge as evaluation
from terraformer.cli import eval as eval_cli

ROUGE = ('rouge1', 'rouge2', 'rougeLsum', 'rougeL')


def _run(capsys, run, *args):
  code = eval_cli.main(['terraformer-eval',
                        *tiny_checkpoints.config_args(run), *args])
  out, err = capsys.readouterr()
  return code, out, err


def _read_jsonl(path):
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def test_rouge_matches_rouge_score_on_the_jsonl(encdec_checkpoint, capsys):
  run, ckpt, _ = encdec_checkpoint
  code, out, err = _run(capsys, run, f'--output_dir={ckpt}',
                        '--max_examples=3', '--batch_size=2',
                        '--max_length=12')
  assert code == 0, err
  jsonl = os.path.join(ckpt, 'eval_test_step2.jsonl')
  with open(os.path.join(ckpt, 'eval_test_step2.json')) as f:
    summary = json.load(f)
  rows = _read_jsonl(jsonl)
  assert len(rows) == 3 == summary['n_examples']
  assert summary['method'] == 'sample' and summary['temperature'] == 0.5
  assert summary['input_len'] == tiny_checkpoints.INPUT_LEN
  # The references are the test papers' abstracts, in split order.
  papers = evaluation.paper_pairs('test')[:3]
  assert [r['reference'] for r in rows] == [a for _, a in papers]
  scorer = rouge_scorer.RougeScorer(list(ROUGE), use_stemmer=True)
  for row in rows:
    assert 0 < row['n_output_tokens'] <= 12
    split = lambda t: '\n'.join(evaluation.split_sentences(t))
    direct = scorer.score(split(row['reference']), split(row['prediction']))
    for name in ROUGE:
      assert row[name] == pytest.approx(direct[name].fmeasure, abs=1e-12)
  for name in ROUGE:
    assert summary[name] == pytest.approx(np.mean([r[name] for r in rows]))
  assert 'ROUGE-LSum' in out and 'log-perplexity' in out
  assert f'{100 * summary["rouge1"]:6.2f}' in out
  # The extractive baselines, on the same papers, in the same table.
  assert set(summary['baselines']) == {'lead_3', 'lead_matched', 'random_3'}
  for row, (body, _) in zip(rows, papers):
    lead = '\n'.join(evaluation.split_sentences(body)[:3])
    assert row['baselines']['lead_3']['rouge2'] == pytest.approx(
        scorer.score(split(row['reference']), lead)['rouge2'].fmeasure)
  for name in ROUGE:
    assert summary['baselines']['lead_3'][name] == pytest.approx(
        np.mean([r['baselines']['lead_3'][name] for r in rows]))
  table = [l for l in out.splitlines()
           if l.startswith(('model ', 'lead-3 ', 'lead-k matched (mean k ',
                            'random 3 (seed 0) '))]
  assert len(table) == 4 + 3, out  # The ROUGE table, then the fluency one.
  assert f'{100 * summary["baselines"]["lead_3"]["rouge2"]:.2f}' in table[1]
  # The summary file holds the tables printed.
  assert summary['tables'] == eval_cli.summary_tables(summary)
  assert table[:4] == eval_cli.common.format_aligned(
      summary['tables']['rouge']).splitlines()[1:]
  # Fluency of the predictions and, as their yardstick, of the references,
  # against the train papers: test abstracts are English, so most of their
  # words and a share of their trigrams occur in the train papers.
  fluency = summary['fluency']
  assert fluency['split'] == 'train'
  refs = fluency['references']
  assert 0 < refs['trigrams'] < refs['words']
  assert 0.8 < refs['known_words'] <= 1 and 0.1 < refs['known_trigrams'] < 1
  printed = [l.split() for l in out.splitlines()
             if l.startswith(('model ', 'references ')) and len(l.split()) == 8]
  assert [p[0] for p in printed] == ['model', 'references'], out
  assert printed[1][5:7] == [f'{100 * refs["known_words"]:.1f}',
                             f'{100 * refs["known_trigrams"]:.1f}']


def test_log_perplexity_matches_the_training_eval(encdec_checkpoint, capsys):
  # terraformer-train evaluated the final weights on the first validation
  # batch (2 papers, same lengths); terraformer-eval must agree.
  run, ckpt, train_stdout = encdec_checkpoint
  code, _, err = _run(capsys, run, f'--output_dir={ckpt}',
                      '--split=validation', '--max_examples=2',
                      '--method=greedy', '--batch_size=2')
  assert code == 0, err
  with open(os.path.join(ckpt, 'eval_validation_step2.json')) as f:
    summary = json.load(f)
  assert summary['max_length'] == tiny_checkpoints.TARGET_LEN
  assert summary['temperature'] is None
  expected = tiny_checkpoints.last_eval_log_perplexity(train_stdout)
  assert summary['log_perplexity'] == pytest.approx(expected, abs=1e-3)
  # Per-example values weight up to the corpus value.
  rows = _read_jsonl(os.path.join(ckpt, 'eval_validation_step2.jsonl'))
  total = sum(r['log_perplexity'] * r['n_reference_tokens'] for r in rows)
  assert total / sum(r['n_reference_tokens'] for r in rows) == (
      pytest.approx(summary['log_perplexity']))


def test_examples_fn_binding(encdec_checkpoint, capsys):
  run, ckpt, _ = encdec_checkpoint
  code, out, err = _run(
      capsys, run, f'--output_dir={ckpt}', '--max_examples=2',
      '--config=terraformer.evaluate.examples_fn = '
      '@terraformer.data.summarization_pairs',
      "--config=summarization_pairs.source = 'aclsum'",
      '--method=beam', '--beam_size=2', '--max_length=6', '--nobaselines')
  assert code == 0, err
  rows = _read_jsonl(os.path.join(ckpt, 'eval_test_step2.jsonl'))
  assert len(rows) == 2
  assert 'lead-3' not in out and all('baselines' not in r for r in rows)
  assert [r['reference'] for r in rows] == [
      a for _, a in evaluation.paper_pairs('test')[:2]]


def test_user_errors(encdec_checkpoint, lm_checkpoint, capsys, tmp_path):
  run, ckpt, _ = encdec_checkpoint
  lm_run, lm_ckpt, _ = lm_checkpoint
  cases = [
      (run, [f'--output_dir={tmp_path}'], 'no checkpoint model.pkl.gz'),
      (run, [f'--output_dir={ckpt}', '--split=nope'], "Unknown split 'nope'"),
      (run, [f'--output_dir={ckpt}', '--config=terraformer.evaluate.x = 1'],
       'bad gin config'),
      (run, [f'--output_dir={ckpt}', '--input_len=4096'],
       "exceeds the model's maximum length 128"),
      (lm_run, [f'--output_dir={lm_ckpt}'], 'needs an encoder-decoder'),
  ]
  for which, args, message in cases:
    code, out, err = _run(capsys, which, *args)
    assert code == 2, (args, err)
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        'terraformer-eval: error: ') and message in lines[0], err
  assert not any(n.startswith('eval_') for n in os.listdir(lm_ckpt))


def test_fluency_table_gives_model_and_references_in_percent():
  row = lambda words, trigrams, repeated: {
      'known_words': words, 'known_trigrams': trigrams,
      'repeated_trigrams': repeated, 'words': 10, 'trigrams': 8}
  summary = {'rouge1': 0.25, 'rouge2': 0.015, 'rougeL': 0.16,
             'prediction_words': 90.14, 'reference_words': 116.86,
             'fluency': {'split': 'train', 'model': row(0.9, 0.125, None),
                         'references': row(1.0, 0.5, 0.0)}}
  table = eval_cli.fluency_table(summary)
  assert table['columns'][-3:] == ['known words (%)', 'known trigrams (%)',
                                   'repeated trigrams (%)']
  assert table['rows'] == [
      ['model', '25.00', '1.50', '16.00', '90.1', '90.0', '12.5', '–'],
      ['references', '–', '–', '–', '116.9', '100.0', '50.0', '0.0']]
  assert eval_cli.fluency_table({}) is None
