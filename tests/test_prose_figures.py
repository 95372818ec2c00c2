"""Every figure the prose of a results page states is held by a results file.

The pages are README.md and the docs/*.md that carry generated blocks
(`<!-- results:NAME/TABLE -->` ... `<!-- /results -->`, filled from
results/*.json by tools/results.py). Their prose is the text outside those
blocks, outside fenced code blocks, inline code spans, HTML comments, link
targets (`](...)`) and URLs.

A *figure* is a measured-looking quantity written in that prose:

- a number with a decimal point or an exponent: `0.72`, `6.224`, `1.14M`,
  `1e-5` (whatever follows it);
- an integer with a unit that makes it a measurement: a ratio `18x`/`18×`,
  a percentage `75%`, a time (`ns`, `µs`/`us`, `ms`, `s`, `sec`, `seconds`,
  `min`, `minutes`, `h`, `hours`, `core-hours`, `CPU-hours`, `CPU-s`), a size
  (`KB`, `MB`, `GB`, `TB`, `KiB`, `MiB`, `GiB`) or a rate (any of those
  `/s`, `tokens/s`, `steps/s`);
- a range of such numbers, `5-15x`, `0.6-0.8`, `2 to 3 GB` (its unit applies
  to both ends).

Not figures: plain integers (settings and counts: `400 steps`, `d_model 64`,
`2 seeds`, `800M`, years, integer ranges such as `test 32-37`); numbers
right after a letter, `_`, `.` or `/` (`T5`, `ROUGE-2`, `I.25`); version
numbers (`1.4.1`, `0.10.2`, and a two-part number after Python, Trax, JAX,
jaxlib, TensorFlow, CUDA, numpy, gin or `v`); section, table, figure,
equation and appendix numbers (`§4.2`, `Table 4`, `Section 3.1`, `appendix
6.6`); settings and goals named right before the number (`lr 0.0005`,
`T = 0.7`, `temperature 0.5`, `dropout 0.1`, `noise 0.5`, `target 1.5x`);
dates (`2026-11-29`); arXiv ids; anything in code (gin values, commands,
paths, tests' tolerances written as code).

A figure is *held* when a results file holds its number as written: the
number's text (`3.65` of `3.65x`, both ends of a range) is a whole number in
some string of a results/*.json's tables (captions, columns, cells, costs),
figures or cost, whatever unit follows it there (`3.65` matches a cell
`3.65x`, `0.72` matches `0.72 ms`; `3.6` matches neither). An integer
figure is held only where the results hold the same integer with a unit
after it (`37x` by `37x`, `37 ms` or `37%`, not by `37.0x` nor by the `37`
of `n 37`) or as a whole cell. Or the figure is quoted from a paper and
listed, with the paper and the table it comes from, in
tests/paper_figures.txt (matched by its full text, unit included).

The match is by number text only: a figure that some unrelated results file
happens to hold passes, so the test catches figures no run recorded, not
every figure that disagrees with its own table.
"""
import glob
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_FIGURES = os.path.join(ROOT, 'tests', 'paper_figures.txt')
PAPERS = '/work/shared/papers'

BLOCK_OPEN = re.compile(r'^<!-- results:\S+ -->\s*$')
BLOCK_CLOSE = re.compile(r'^<!-- /results -->\s*$')
FENCE = re.compile(r'^\s*(```|~~~)')

NUM = r'\d+(?:\.\d+)?(?:e[-+]?\d+)?'
UNIT = (r'(?:[x×](?![\w])|\s?%'
        r'|\s?(?:tokens/s|steps/s|GFLOP/s'
        r'|(?:[KMGT]i?B)(?:/s)?'
        r'|core-hours?|CPU-hours?|CPU-s|core-s'
        r'|ns|µs|us|ms|sec|seconds?|minutes?|min|hours?|s|h)(?![\w/-]))')
FIGURE = re.compile(
    rf'(?<![\w.§/])(?P<a>{NUM})'
    rf'(?:(?P<sep>\s?[-–]\s?|\s+to\s+)(?P<b>{NUM}))?'
    rf'(?P<unit>{UNIT})?'
    r'(?!\.?\d)')
# Numbers right after these words are versions, references or settings.
NOT_BEFORE = re.compile(
    r'(?:\b(?:Python|Trax|JAX|jax|jaxlib|TensorFlow|tensorflow|CUDA|numpy|gin'
    r'|(?i:version|tables?|figures?|fig\.|eq\.|equation|sections?|sec\.'
    r'|appendix|app\.|lines?|lr|learning rate|dropout|temperature|noise'
    r'|targets?))|\bT|§|\bv)\s*=?\s*$')
VERSION = re.compile(r'(?<![\w.])\d+(?:\.\d+){2,}(?![\w.])')
DATE = re.compile(r'\b\d{4}-\d{2}-\d{2}\b')
RESULT_NUMBER = re.compile(
    rf'(?<![\w.])(?P<n>{NUM})(?![\d])(?!\.\d)(?P<unit>{UNIT})?')


# ---------------------------------------------------------------------------
# The prose of a page.


def _blank(match):
  return re.sub(r'[^\n]', ' ', match.group(0))


def prose_lines(text):
  """[(line number, prose of that line)]: the page's text outside generated
  blocks, fenced code, HTML comments, inline code, link targets and URLs."""
  kept, in_block, in_fence = [], False, False
  for line in text.split('\n'):
    if in_block:
      in_block = not BLOCK_CLOSE.match(line)
      kept.append('')
    elif BLOCK_OPEN.match(line):
      in_block = True
      kept.append('')
    elif FENCE.match(line):
      in_fence = not in_fence
      kept.append('')
    else:
      kept.append('' if in_fence else line)
  text = '\n'.join(kept)
  text = re.sub(r'<!--.*?-->', _blank, text, flags=re.S)
  text = re.sub(r'(`+)(?:(?!\1).)+?\1', _blank, text, flags=re.S)
  text = re.sub(r'\]\([^)]*\)', _blank, text)
  text = re.sub(r'<https?://[^>]*>|https?://\S+', _blank, text)
  text = re.sub(r'arXiv:\s?\d{4}\.\d{4,5}', _blank, text)
  text = VERSION.sub(_blank, text)
  text = DATE.sub(_blank, text)
  return list(enumerate(text.split('\n'), start=1))


def figures_in(line):
  """The figures (as written) one line of prose states."""
  found = []
  for m in FIGURE.finditer(line):
    a, b, unit = m.group('a'), m.group('b'), m.group('unit')
    if NOT_BEFORE.search(line[:m.start()]):
      continue
    decimal = any(n and re.search(r'[.e]', n) for n in (a, b))
    if not (decimal or unit):
      continue
    found.append(m.group(0).strip())
  return found


def _numbers(figure):
  """(number texts, unit) of a figure: `5-15x` -> (['5', '15'], 'x')."""
  m = FIGURE.fullmatch(figure)
  return [n for n in (m.group('a'), m.group('b')) if n], m.group('unit')


# ---------------------------------------------------------------------------
# What the results files and the papers hold.


def _strings(value):
  if isinstance(value, str):
    yield value
  elif isinstance(value, dict):
    for v in value.values():
      yield from _strings(v)
  elif isinstance(value, list):
    for v in value:
      yield from _strings(v)


def results_strings(root=ROOT):
  """Every string of the results files' tables, figures and costs."""
  strings = []
  for path in sorted(glob.glob(os.path.join(root, 'results', '*.json'))):
    with open(path, encoding='utf-8') as f:
      data = json.load(f)
    if not isinstance(data, dict):  # readme.json: rows that point at figures
      continue
    for key in ('tables', 'figures', 'cost'):
      strings.extend(_strings(data.get(key, {})))
  return strings


def held_numbers(strings):
  """({number text}, {integer text with a unit, or a whole-cell integer})."""
  numbers, integers = set(), set()
  for s in strings:
    if re.fullmatch(r'\s*\d+\s*', s):
      integers.add(s.strip())
    for m in RESULT_NUMBER.finditer(s):
      numbers.add(m.group('n'))
      if m.group('unit'):
        integers.add(m.group('n'))
  return numbers, integers


def paper_figures(path=PAPER_FIGURES):
  """[(figure, paper file stem, where)] of the allowlist."""
  entries = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      line = line.split('#', 1)[0].strip()
      if line:
        figure, paper, where = (p.strip() for p in line.split('|'))
        entries.append((figure, paper, where))
  return entries


def is_held(figure, numbers, integers, quoted):
  if figure in quoted:
    return True
  texts, _ = _numbers(figure)
  return all(n in (numbers if re.search(r'[.e]', n) else integers)
             for n in texts)


# ---------------------------------------------------------------------------
# The pages.


def result_pages(root=ROOT):
  pages = [os.path.join(root, 'README.md')]
  pages += sorted(glob.glob(os.path.join(root, 'docs', '*.md')))
  found = []
  for page in pages:
    with open(page, encoding='utf-8') as f:
      if '<!-- results:' in f.read():
        found.append(page)
  return found


def page_figures(page):
  """[(line number, figure)] of one page's prose."""
  with open(page, encoding='utf-8') as f:
    text = f.read()
  return [(n, fig) for n, line in prose_lines(text) for fig in figures_in(line)]


def unheld_figures(root=ROOT):
  numbers, integers = held_numbers(results_strings(root))
  quoted = {f for f, _, _ in paper_figures()}
  unheld = []
  for page in result_pages(root):
    rel = os.path.relpath(page, root)
    for n, fig in page_figures(page):
      if not is_held(fig, numbers, integers, quoted):
        unheld.append(f'{rel}:{n}: {fig}')
  return unheld


# ---------------------------------------------------------------------------
# Tests.


def test_the_pages_state_figures():
  """Not vacuous: several pages, and many figures found on them."""
  pages = result_pages()
  assert len(pages) >= 8, pages
  counts = {os.path.relpath(p, ROOT): len(page_figures(p)) for p in pages}
  assert sum(counts.values()) >= 100, counts
  assert sum(1 for c in counts.values() if c) >= 6, counts


def test_every_figure_is_held_by_a_results_file_or_the_papers():
  unheld = unheld_figures()
  assert not unheld, (
      f'{len(unheld)} figures of the prose are in no results/*.json nor in '
      'tests/paper_figures.txt (say them without the number, or quote the '
      "page's table):\n" + '\n'.join(unheld))


def test_the_paper_figures_are_in_the_papers():
  """Each allowlisted figure names its paper and table, and (where the
  papers' text is at hand) that paper prints its number."""
  entries = paper_figures()
  assert entries and len(entries) <= 40
  for figure, paper, where in entries:
    assert figures_in(figure) == [figure], figure
    assert paper and where, figure
    text_path = os.path.join(PAPERS, paper + '.txt')
    if os.path.exists(text_path):
      with open(text_path, encoding='utf-8') as f:
        text = f.read()
      for n in _numbers(figure)[0]:
        assert re.search(rf'(?<![\d.]){re.escape(n)}(?![\d]|\.\d)', text), (
            f'{figure}: not in {paper}')


EXAMPLE = """\
# Speed (Table 4)

The sparse block takes 0.72 ms, 3.65x the dense one, and 75% of the
steps; sorting costs 5-15x more, 18x at n 1024 and 45 GB/s at best
(17.6 ms). A run of 400 steps, d_model 64, 2 seeds, §4.2, Table 4.2,
appendix 6.6, in 2021 on Python 3.11, Trax 1.4.1, jax 0.10.2; `lr=0.72`,
lr 0.0005, T = 0.7, target 1.5x, arXiv:2506.13688, 800M, 17B,
[link](docs/x_1.5.md#v2.5), ROUGE-2, test 32-37, dated 2026-11-29.
<!-- a comment: 4.44x -->

<!-- results:x/y -->
| 9.99x |
<!-- /results -->

```
echo 6.224
```
"""


def test_the_extractor_on_a_made_up_paragraph():
  found = [fig for _, line in prose_lines(EXAMPLE) for fig in figures_in(line)]
  assert found == ['0.72 ms', '3.65x', '75%', '5-15x', '18x', '45 GB/s',
                   '17.6 ms']
  numbers, integers = held_numbers(['3.65x', '0.72', 'speedup 18x', '15',
                                    'n 5 and 45'])
  assert is_held('3.65x', numbers, integers, set())
  assert is_held('0.72 ms', numbers, integers, set())
  assert is_held('18x', numbers, integers, set())
  assert not is_held('5-15x', numbers, integers, set())   # 5: no unit
  assert not is_held('45 GB/s', numbers, integers, set())
  assert not is_held('3.6x', numbers, integers, set())
  assert is_held('45 GB/s', numbers, integers, {'45 GB/s'})
