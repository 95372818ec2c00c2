"""A tiny synthetic S2ORC-shaped corpus for the data tests."""
import json
import os

import numpy as np

from terraformer.data import aclsum_papers

VOCAB_SIZE = 200
# Papers per split in the synthetic corpus.
SPLIT_COUNTS = {'train': 8, 'validation': 2, 'test': 2}


def _words(rng, n):
  """Returns `n` pseudo-words built from consonant-vowel syllables."""
  syllables = [c + v for c in 'bdfgklmnprstvz' for v in 'aeiou']
  return [''.join(rng.choice(syllables, size=rng.integers(1, 5)))
          for _ in range(n)]


def _text(rng, lexicon, n_sentences):
  sentences = []
  for _ in range(n_sentences):
    words = rng.choice(lexicon, size=rng.integers(4, 12))
    sentences.append(' '.join(words).capitalize() + '.')
  return ' '.join(sentences)


def write_paper(directory, paper_id, abstract, paragraphs):
  """Writes one S2ORC-shaped JSON file `<paper_id>.json`."""
  paper = {
      'paper_id': '2020',  # Not unique in aclsum either; ids come from names.
      'title': paper_id,
      'abstract': abstract,
      'pdf_parse': {
          'abstract': [],
          'body_text': [{'text': t, 'section': 'S'} for t in paragraphs],
      },
  }
  with open(os.path.join(directory, f'{paper_id}.json'), 'w') as f:
    json.dump(paper, f)


def make_corpus(directory, counts=None, seed=0):
  """Writes synthetic papers with `counts[split]` papers in each split."""
  counts = dict(SPLIT_COUNTS if counts is None else counts)
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  lexicon = _words(rng, 300)
  i = 0
  while any(counts.values()):
    paper_id = f'P{seed}-{i}'
    i += 1
    split = aclsum_papers.split_of(paper_id)
    if not counts[split]:
      continue
    counts[split] -= 1
    paragraphs = [_text(rng, lexicon, rng.integers(2, 6))
                  for _ in range(rng.integers(3, 7))]
    write_paper(directory, paper_id, _text(rng, lexicon, 3), paragraphs)
  return str(directory)
