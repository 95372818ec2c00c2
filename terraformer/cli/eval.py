"""terraformer-eval: ROUGE and perplexity of a trained summarizer (Table 5).

  terraformer-eval --config_file=F --output_dir=CKPT_DIR [--split=test]
      [--max_examples=N] [--method=sample|greedy|beam] [--temperature=0.5]
      [--top_k=K] [--top_p=P] [--beam_size=B] [--length_penalty=A]
      [--no_repeat_ngram=N] [--max_length=N] [--input_len=N] [--batch_size=N] [--seed=S]
      [--[no]baselines] [--print_examples=N]

Decodes the articles of a split with the checkpoint in CKPT_DIR and reports
ROUGE-1, ROUGE-2, ROUGE-LSum and ROUGE-L F1 (rouge-score) and the reference
log-perplexity in one table with the extractive baselines scored on the
same examples (lead-3, lead-k matched to the reference's length, 3 random
sentences; --nobaselines skips them); see
`terraformer.evaluation.rouge.evaluate`, whose gin parameters
(`terraformer.evaluate.*`) the flags override when given. By default the
paper's decoding (temperature 0.5) on the offline aclsum papers; bind
`terraformer.evaluate.examples_fn = @terraformer.data.summarization_pairs`
for arXiv. Per-example outputs (JSONL) and the summary (JSON) are written
into CKPT_DIR, the summary with the tables printed under "tables" (rouge,
fluency: {"columns", "rows"}); --print_examples=N also prints the first N
generated summaries next to their references.
"""
import itertools
import json
import os
import sys

from absl import flags

from terraformer import config
from terraformer.cli import common
from terraformer.cli import decode as decode_cli

PROG = 'terraformer-eval'
# Flags passed to `evaluate` when given (None: the gin binding or default).
_EVALUATE_FLAGS = ('split', 'max_examples', 'method', 'temperature', 'top_k',
                   'top_p', 'beam_size', 'length_penalty', 'no_repeat_ngram',
                   'max_length',
                   'input_len', 'batch_size', 'seed', 'baselines')


def _define_flags(flag_values):
  define = lambda kind, name, text, **kw: kind(
      name, None, text, flag_values=flag_values, **kw)
  define(flags.DEFINE_string, 'output_dir',
         'Directory with the checkpoint (model.pkl.gz); results go there.')
  define(flags.DEFINE_string, 'split', 'Split to evaluate (default test).')
  define(flags.DEFINE_integer, 'max_examples', 'Only the first N examples.',
         lower_bound=1)
  flags.DEFINE_enum('method', None, ['greedy', 'sample', 'beam'],
                    'Decoding method (default sample at temperature 0.5, '
                    'the paper\'s setting).', flag_values=flag_values)
  define(flags.DEFINE_float, 'temperature', 'Sampling temperature.')
  define(flags.DEFINE_integer, 'top_k', 'Top-k sampling.', lower_bound=0)
  define(flags.DEFINE_float, 'top_p', 'Nucleus sampling probability.')
  define(flags.DEFINE_integer, 'beam_size', 'Beams (method=beam).',
         lower_bound=1)
  define(flags.DEFINE_float, 'length_penalty', 'Beam length penalty alpha.')
  define(flags.DEFINE_integer, 'no_repeat_ngram',
         'N > 0: no summary repeats one of its own token N-grams (default 0, '
         'as Trax).', lower_bound=0)
  define(flags.DEFINE_integer, 'max_length',
         'Most decoded tokens (default the training target length).',
         lower_bound=1)
  define(flags.DEFINE_integer, 'input_len',
         'Article tokens kept (default the training input length).',
         lower_bound=1)
  define(flags.DEFINE_integer, 'batch_size', 'Examples decoded together.',
         lower_bound=1)
  define(flags.DEFINE_integer, 'seed', 'Sampling seed.')
  define(flags.DEFINE_boolean, 'baselines',
         'Also score lead-3, lead-k matched and random sentences (default '
         'on; terraformer.evaluate.baselines).')
  flags.DEFINE_integer('print_examples', 0,
                       'Also print the first N generated summaries and their '
                       'references.', lower_bound=0, flag_values=flag_values)


def _precheck(flag_values):
  decode_cli.check_checkpoint(flag_values.output_dir)


ROUGE = (('rouge1', 'ROUGE-1'), ('rouge2', 'ROUGE-2'),
         ('rougeLsum', 'ROUGE-LSum'), ('rougeL', 'ROUGE-L'))
FLUENCY = (('known_words', 'known words (%)'),
           ('known_trigrams', 'known trigrams (%)'),
           ('repeated_trigrams', 'repeated trigrams (%)'))
MISSING = common.MISSING


def _f(value, fmt, scale=1):
  return MISSING if value is None else format(scale * value, fmt)


def _baselines(summary):
  """(label, scores) of the summary's extractive yardsticks, in the order
  the tables show them: lead-k, lead-k matched, k random sentences."""
  base = summary.get('baselines') or {}
  k, seed = summary.get('baseline_k'), summary.get('baseline_seed')
  labels = ((f'lead_{k}', lambda _: f'lead-{k}'),
            ('lead_matched',
             lambda s: f'lead-k matched (mean k {s.get("sentences", 0):.1f})'),
            (f'random_{k}', lambda _: f'random {k} (seed {seed})'))
  return [(label(base[key]), base[key]) for key, label in labels
          if key in base]


def rouge_table(summary):
  """ROUGE F1 (%) of the model beside its extractive yardsticks (the same
  papers), with the mean words of each one's summaries."""
  rows = [['model'] + [_f(summary.get(key), '.2f', 100) for key, _ in ROUGE]
          + [_f(summary.get('prediction_words'), '.1f')]]
  rows += [[label] + [_f(scores.get(key), '.2f', 100) for key, _ in ROUGE]
           + [_f(scores.get('words'), '.1f')]
           for label, scores in _baselines(summary)]
  return common.table(['F1 (%)'] + [name for _, name in ROUGE] + ['words'],
                      rows)


def fluency_table(summary):
  """The model's summaries beside the references and the yardsticks (lead-k,
  k random sentences): ROUGE-1/2/L F1, words, and the shares (%) of known
  words, known trigrams and repeated trigrams (`evaluation.fluency`; the
  yardsticks' are not measured); None without fluency in the summary."""
  fluency = summary.get('fluency')
  if not fluency:
    return None
  rouge = [(k, name) for k, name in ROUGE if k != 'rougeLsum']
  shares = lambda f: [_f(f.get(k), '.1f', 100) for k, _ in FLUENCY]
  rows = [['model'] + [_f(summary.get(k), '.2f', 100) for k, _ in rouge] +
          [_f(summary.get('prediction_words'), '.1f')] +
          shares(fluency['model'])]
  rows.append(['references'] + [MISSING] * len(rouge) +
              [_f(summary.get('reference_words'), '.1f')] +
              shares(fluency['references']))
  rows += [[label] + [_f(scores.get(k), '.2f', 100) for k, _ in rouge] +
           [_f(scores.get('words'), '.1f')] + [MISSING] * len(FLUENCY)
           for label, scores in _baselines(summary)
           if not label.startswith('lead-k matched')]
  return common.table(['setting'] + [name for _, name in rouge] + ['words'] +
                      [name for _, name in FLUENCY], rows)


def summary_tables(summary):
  """{name: table} of an `evaluate` summary: rouge, and fluency where it
  was measured."""
  tables = {'rouge': rouge_table(summary)}
  fluency = fluency_table(summary)
  if fluency:
    tables['fluency'] = fluency
  return tables


def format_summary(summary, tables=None):
  """Human-readable lines of an `evaluate` summary: the ROUGE F1 table (in
  percent) with the model's row and the extractive baselines' rows, the
  fluency table, the log-perplexity and the decoding time."""
  tables = tables or summary_tables(summary)
  lines = [f'{summary["n_examples"]} examples of split '
           f'{summary["split"]!r}, checkpoint step {summary["step"]}, '
           f'method {summary["method"]}'
           + (f' (temperature {summary["temperature"]})'
              if summary['method'] == 'sample' else '')
           + (f', no repeated {summary["no_repeat_ngram"]}-grams'
              if summary.get('no_repeat_ngram') else ''),
           common.format_aligned(tables['rouge'])]
  if 'reference_words' in summary:
    lines.append(f'(references: {summary["reference_words"]:.1f} words; '
                 'ROUGE-LSum per sentence, ROUGE-L over the whole text; '
                 f'sentences by {summary["sentence_splitter"]})')
  if 'fluency' in tables:
    lines += [f'fluency vs the {summary["fluency"]["split"]} texts (shares '
              'in %), beside ROUGE F1 (%):',
              common.format_aligned(tables['fluency'])]
  lines.append(f'{"log-perplexity":<20} {summary["log_perplexity"]:.4f} '
               f'(perplexity {summary["perplexity"]:.2f})')
  lines.append(f'decoding: {summary["n_decoded_tokens"]} tokens in '
               f'{summary["decode_seconds"]:.1f} s '
               f'({1000 * summary["seconds_per_token"]:.1f} ms/token)')
  lines.append(f'per example: {summary["examples_jsonl"]}')
  lines.append(f'summary:     {summary["summary_json"]}')
  return '\n'.join(lines)


def format_examples(jsonl_path, n, max_chars=600):
  """The first `n` examples of an `evaluate` JSONL: prediction, reference."""
  lines = []
  with open(jsonl_path, encoding='utf-8') as f:
    for row in itertools.islice(f, n):
      row = json.loads(row)
      cut = lambda text: (text if len(text) <= max_chars
                          else text[:max_chars] + ' [...]')
      lines += [f'--- example {row["index"]} (ROUGE-1 F1 '
                f'{100 * row["rouge1"]:.2f}): {cut(row["article_start"])!r}',
                f'generated: {cut(row["prediction"])}',
                f'reference: {cut(row["reference"])}']
  return '\n'.join(lines)


def _eval(flag_values):
  from terraformer.evaluation import rouge as evaluation  # pylint: disable=g-import-not-at-top
  config.require_bindings('terraformer.text_vocab', ['vocab_size'])
  kwargs = {name: getattr(flag_values, name) for name in _EVALUATE_FLAGS
            if getattr(flag_values, name) is not None}
  summary = evaluation.evaluate(flag_values.output_dir, **kwargs)
  tables = summary_tables(summary)
  print(format_summary(summary, tables))
  # The summary JSON also holds the tables printed.
  path = summary['summary_json']
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    json.dump(common.with_tables(summary, tables), f, indent=2)
  os.replace(path + '.tmp', path)
  if flag_values.print_examples:
    print(format_examples(summary['examples_jsonl'],
                          flag_values.print_examples))
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _eval, precheck=_precheck)


if __name__ == '__main__':
  sys.exit(main())
