"""Tests for terraformer.data.aclsum_papers."""
import collections
import json
import os
import subprocess
import sys

import pytest

from terraformer.data import aclsum_papers
from terraformer.errors import TerraformerError
import synthetic_papers


def test_records_join_paragraphs_and_use_file_name_as_id(tmp_path):
  synthetic_papers.write_paper(tmp_path, 'abc-1', ' An abstract. ',
                       ['First paragraph.', '  ', 'Second one.'])
  (papers,) = aclsum_papers.load_papers(str(tmp_path))
  assert papers == {'id': 'abc-1', 'abstract': 'An abstract.',
                    'body': 'First paragraph.\nSecond one.'}


def test_skips_unusable_papers_and_non_json_files(tmp_path):
  synthetic_papers.write_paper(tmp_path, 'good', 'Abstract.', ['Body.'])
  synthetic_papers.write_paper(tmp_path, 'no_body', 'Abstract.', [])
  synthetic_papers.write_paper(tmp_path, 'no_abstract', '', ['Body.'])
  (tmp_path / 'notes.txt').write_text('not a paper')
  assert [p['id'] for p in aclsum_papers.load_papers(str(tmp_path))] == [
      'good']


def test_splits_are_disjoint_cover_everything_and_repeatable(papers_dir):
  papers = aclsum_papers.load_papers(papers_dir)
  ids = {s: [p['id'] for p in aclsum_papers.load_split(s, papers_dir)]
         for s in aclsum_papers.SPLITS}
  all_ids = [i for s in ids.values() for i in s]
  assert sorted(all_ids) == sorted(p['id'] for p in papers)
  assert len(set(all_ids)) == len(all_ids)
  assert {s: len(v) for s, v in ids.items()} == synthetic_papers.SPLIT_COUNTS
  again = {s: [p['id'] for p in aclsum_papers.load_split(s, papers_dir)]
           for s in aclsum_papers.SPLITS}
  assert again == ids


def test_split_depends_only_on_id_not_on_the_rest_of_the_corpus(
    papers_dir, tmp_path):
  papers = aclsum_papers.load_papers(papers_dir)
  subset = papers[::3]
  for p in subset:
    synthetic_papers.write_paper(tmp_path, p['id'], p['abstract'], [p['body']])
  for split in aclsum_papers.SPLITS:
    full = {p['id'] for p in papers if aclsum_papers.split_of(p['id']) == split}
    sub = {p['id'] for p in aclsum_papers.load_papers(str(tmp_path))
           if aclsum_papers.split_of(p['id']) == split}
    assert sub == full & {p['id'] for p in subset}


def test_split_proportions_are_about_80_10_10():
  counts = collections.Counter(
      aclsum_papers.split_of(f'paper-{i}') for i in range(5000))
  assert 0.77 < counts['train'] / 5000 < 0.83
  assert 0.08 < counts['validation'] / 5000 < 0.12
  assert 0.08 < counts['test'] / 5000 < 0.12


def test_split_is_stable_across_processes_and_hash_seeds():
  ids = [f'2020.acl-main.{i}' for i in range(200)]
  code = ('import json, sys; from terraformer.data import aclsum_papers as a; '
          'print(json.dumps([a.split_of(i) for i in json.loads(sys.argv[1])]))')
  outputs = set()
  for hash_seed in ('1', '2'):
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    out = subprocess.run([sys.executable, '-c', code, json.dumps(ids)],
                         env=env, check=True, capture_output=True, text=True)
    outputs.add(out.stdout)
  assert outputs == {json.dumps([aclsum_papers.split_of(i) for i in ids]) +
                     '\n'}


def test_missing_dir_raises_naming_the_path(tmp_path):
  missing = str(tmp_path / 'nope')
  with pytest.raises(TerraformerError, match='nope'):
    aclsum_papers.load_papers(missing)


def test_empty_dir_raises_naming_the_path(tmp_path):
  with pytest.raises(TerraformerError, match=str(tmp_path)):
    aclsum_papers.load_papers(str(tmp_path))


def test_dir_without_usable_papers_raises(tmp_path):
  synthetic_papers.write_paper(tmp_path, 'no_body', 'Abstract.', [])
  with pytest.raises(TerraformerError, match='No usable papers'):
    aclsum_papers.load_papers(str(tmp_path))


def test_empty_split_and_unknown_split_raise(tmp_path):
  synthetic_papers.make_corpus(
      tmp_path, {'train': 2, 'validation': 0, 'test': 1})
  assert len(aclsum_papers.load_split('train', str(tmp_path))) == 2
  with pytest.raises(TerraformerError, match="'validation'.*empty"):
    aclsum_papers.load_split('validation', str(tmp_path))
  with pytest.raises(TerraformerError, match='Unknown split'):
    aclsum_papers.load_split('dev', str(tmp_path))


def test_corpus_name_changes_with_content(tmp_path, papers_dir):
  papers = aclsum_papers.load_papers(papers_dir)
  name = aclsum_papers.corpus_name(papers, papers_dir)
  changed = [dict(papers[0], body=papers[0]['body'] + ' x')] + papers[1:]
  assert aclsum_papers.corpus_name(changed, papers_dir) != name
  assert aclsum_papers.corpus_name(list(papers), papers_dir) == name


def test_default_dir_is_the_bundled_aclsum_papers():
  directory = aclsum_papers.default_papers_dir()
  assert os.path.isdir(directory)
  assert len([n for n in os.listdir(directory) if n.endswith('.json')]) == 250
