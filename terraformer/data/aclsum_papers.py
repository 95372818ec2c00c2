"""The 250 ACL papers bundled with the `aclsum` package, with fixed splits.

Each paper is an S2ORC JSON file; a record is `{'id', 'body', 'abstract'}`,
where `id` is the file name without `.json` (the S2ORC `paper_id` field is not
unique in this corpus) and `body` is the paragraphs joined with newlines.
"""
import hashlib
import importlib.util
import json
import os

from terraformer.errors import TerraformerError

SPLITS = ('train', 'validation', 'test')
# Percent of papers per split, by a stable hash of the paper id.
_SPLIT_PERCENT = {'train': 80, 'validation': 10, 'test': 10}


def default_papers_dir():
  """Returns the `paper_jsons` directory shipped inside the `aclsum` package."""
  # find_spec locates the package without importing it (and its dependencies).
  spec = importlib.util.find_spec('aclsum')
  if spec is None or not spec.submodule_search_locations:
    raise TerraformerError(
        'Package `aclsum` is not installed; pip install aclsum or pass '
        'papers_dir.')
  package_dir = list(spec.submodule_search_locations)[0]
  return os.path.join(package_dir, 'dataset', 'paper_jsons')


def _read_paper(path):
  """Returns the record of one S2ORC JSON file, or None if it is unusable."""
  try:
    with open(path, encoding='utf-8') as f:
      paper = json.load(f)
  except (OSError, ValueError) as e:
    raise TerraformerError(f'Cannot read paper {path}: {e}') from e
  if not isinstance(paper, dict):
    return None
  paragraphs = (paper.get('pdf_parse') or {}).get('body_text') or []
  body = '\n'.join(p.get('text', '').strip() for p in paragraphs
                   if isinstance(p, dict) and p.get('text', '').strip())
  abstract = (paper.get('abstract') or '').strip()
  if not body or not abstract:
    return None
  paper_id = os.path.splitext(os.path.basename(path))[0]
  return {'id': paper_id, 'body': body, 'abstract': abstract}


def load_papers(papers_dir=None):
  """Loads all usable papers (non-empty body and abstract), sorted by id.

  Args:
    papers_dir: directory of S2ORC `*.json` files; default: aclsum's papers.

  Returns:
    A list of dicts `{'id', 'body', 'abstract'}`.
  """
  papers_dir = os.path.expanduser(papers_dir or default_papers_dir())
  if not os.path.isdir(papers_dir):
    raise TerraformerError(f'Papers directory not found: {papers_dir}')
  names = sorted(n for n in os.listdir(papers_dir) if n.endswith('.json'))
  papers = [_read_paper(os.path.join(papers_dir, n)) for n in names]
  papers = [p for p in papers if p is not None]
  if not papers:
    raise TerraformerError(
        f'No usable papers (S2ORC *.json with body text and abstract) in '
        f'{papers_dir}')
  return papers


def split_of(paper_id):
  """Returns the split of a paper: a stable hash of its id, ~80/10/10."""
  digest = hashlib.sha256(paper_id.encode('utf-8')).digest()
  bucket = int.from_bytes(digest[:8], 'big') % 100
  if bucket < _SPLIT_PERCENT['train']:
    return 'train'
  if bucket < _SPLIT_PERCENT['train'] + _SPLIT_PERCENT['validation']:
    return 'validation'
  return 'test'


def select_split(papers, split, papers_dir=None):
  """Returns the papers (from `load_papers`) that belong to `split`."""
  if split not in SPLITS:
    raise TerraformerError(f'Unknown split {split!r}; expected one of {SPLITS}')
  selected = [p for p in papers if split_of(p['id']) == split]
  if not selected:
    raise TerraformerError(
        f'Split {split!r} of {papers_dir or default_papers_dir()} is empty '
        f'({len(papers)} papers in all)')
  return selected


def load_split(split, papers_dir=None):
  """Returns the papers of one split ('train', 'validation' or 'test')."""
  return select_split(load_papers(papers_dir), split, papers_dir)


def _is_default_dir(papers_dir):
  try:
    default = default_papers_dir()
  except TerraformerError:
    return False
  return os.path.realpath(papers_dir) == os.path.realpath(default)


def corpus_name(papers, papers_dir=None):
  """Returns a short cache key for a corpus: its name and a content hash."""
  h = hashlib.sha256()
  for p in papers:
    for field in ('id', 'abstract', 'body'):
      h.update(p[field].encode('utf-8'))
      h.update(b'\0')
  name = 'aclsum'
  if papers_dir is not None and not _is_default_dir(papers_dir):
    name = os.path.basename(os.path.normpath(papers_dir))
    name = ''.join(c if c.isalnum() or c in '-_.' else '_' for c in name)
  return f'{name}-{h.hexdigest()[:10]}'
