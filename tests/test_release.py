"""The release files agree: one version (terraformer/__init__.py, setup.py,
CITATION.cff, CHANGELOG.md), a citation file that parses and names the three
papers, the Apache License 2.0 unmodified, and a Keep a Changelog layout."""
import datetime
import hashlib
import os
import re
import runpy
import sys

import pytest
import setuptools
import yaml

import terraformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION_LINE = re.compile(r"^__version__ = '([^']+)'$", re.M)
SEMVER = re.compile(r'^\d+\.\d+\.\d+$')
# `## [0.1.0] - 2026-12-01`: a released section of the changelog.
RELEASE = re.compile(r'^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$', re.M)
# sha256 of the Apache License 2.0 as the ASF publishes it
# (https://www.apache.org/licenses/LICENSE-2.0.txt; Trax and JAX ship it).
APACHE_2_SHA256 = (
    'cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30')
COPYRIGHT = 'Copyright 2026 The terraformer Authors'


def _read(name):
  with open(os.path.join(ROOT, name), encoding='utf-8') as f:
    return f.read()


@pytest.fixture(scope='module')
def setup_kwargs():
  """setup.py's arguments to setuptools.setup, with `terraformer` made
  unimportable: setup.py must read the version without importing it."""
  calls = []
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(setuptools, 'setup', lambda **kwargs: calls.append(kwargs))
    mp.setitem(sys.modules, 'terraformer', None)
    mp.chdir(ROOT)
    runpy.run_path(os.path.join(ROOT, 'setup.py'), run_name='__main__')
  assert len(calls) == 1
  return calls[0]


@pytest.fixture(scope='module')
def citation():
  return yaml.safe_load(_read('CITATION.cff'))


@pytest.fixture(scope='module')
def changelog():
  return _read('CHANGELOG.md')


def test_one_version_line_in_the_package():
  found = VERSION_LINE.findall(_read(os.path.join('terraformer',
                                                  '__init__.py')))
  assert found == [terraformer.__version__]
  assert SEMVER.match(terraformer.__version__)


def test_setup_reads_the_packages_version(setup_kwargs):
  assert setup_kwargs['version'] == terraformer.__version__


def test_citation_version_and_date_are_the_releases(citation, changelog):
  version, date = RELEASE.findall(changelog)[0]
  assert str(citation['version']) == terraformer.__version__ == version
  assert citation['date-released'] == datetime.date.fromisoformat(date)


def test_changelog_top_release_is_the_version(changelog):
  releases = RELEASE.findall(changelog)
  assert releases and releases[0][0] == terraformer.__version__
  # Newest first, each version and date once.
  versions = [tuple(map(int, v.split('.'))) for v, _ in releases]
  assert versions == sorted(set(versions), reverse=True)
  dates = [d for _, d in releases]
  assert dates == sorted(dates, reverse=True)
  for _, date in releases:
    datetime.date.fromisoformat(date)


def test_changelog_layout(changelog):
  assert changelog.startswith('# Changelog\n')
  assert 'https://keepachangelog.com/en/1.1.0/' in changelog
  assert 'https://semver.org/' in changelog
  headings = re.findall(r'^## .*$', changelog, re.M)
  assert headings[0] == '## [Unreleased]', headings
  assert headings[1] == f'## [{terraformer.__version__}] - ' + (
      RELEASE.findall(changelog)[0][1])
  # Every level-2 heading is Unreleased or a release; every level-3 one
  # under them a kind of change.
  assert all(h == '## [Unreleased]' or RELEASE.match(h) for h in headings)
  kinds = set(re.findall(r'^### (.*)$', changelog, re.M))
  assert kinds <= {'Added', 'Changed', 'Deprecated', 'Removed', 'Fixed',
                   'Security'}, kinds


def test_citation_cites_the_software(citation):
  assert citation['cff-version'] == '1.2.0'
  assert citation['type'] == 'software'
  assert citation['title'] == 'terraformer'
  assert citation['license'] == 'Apache-2.0'
  assert citation['authors'] == [{'name': 'The terraformer Authors'}]
  assert citation['message'].strip()
  # The project cites itself; the papers are references, not a
  # preferred-citation standing in for the software.
  assert 'preferred-citation' not in citation


@pytest.mark.parametrize('title, family_names, year, arxiv', [
    ('Sparse is Enough in Scaling Transformers',
     ['Jaszczur', 'Chowdhery', 'Mohiuddin', 'Kaiser', 'Gajewski',
      'Michalewski', 'Kanerva'], 2021, 'arXiv:2111.12763'),
    ('Sparsifying Transformer Models with Trainable Representation Pooling',
     ['Pietruszka', 'Borchmann', 'Garncarek'], 2022, 'arXiv:2009.05169'),
    ('Composite Slice Transformer: An Efficient Transformer with '
     'Composition of Multi-Scale Multi-Range Attentions',
     ['Lee', 'Pitre', 'Jiang', 'Letourneau', 'Morse', 'Jang', 'Soriaga',
      'Noorzad', 'Cheng', 'Lott'], 2023, None),
], ids=['sparse_is_enough', 'pyramidion', 'cst'])
def test_citation_references_the_papers(citation, title, family_names, year,
                                        arxiv):
  by_title = {' '.join(r['title'].split()): r for r in citation['references']}
  assert len(by_title) == len(citation['references']) == 3
  ref = by_title[title]
  assert ref['type'] == 'conference-paper'
  assert [a['family-names'] for a in ref['authors']] == family_names
  assert all(a['given-names'] for a in ref['authors'])
  assert ref['year'] == year and ref['conference']['name']
  ids = [i['value'] for i in ref.get('identifiers', [])]
  assert ids == ([arxiv] if arxiv else [])


def test_license_is_the_apache_license_2_0():
  text = _read('LICENSE')
  first, rest = text.split('\n', 1)
  assert first == COPYRIGHT
  assert hashlib.sha256(rest.encode('utf-8')).hexdigest() == APACHE_2_SHA256
  assert 'Apache License\n' in rest and 'Version 2.0, January 2004' in rest
  assert 'END OF TERMS AND CONDITIONS' in rest and 'APPENDIX' in rest


def test_package_metadata(setup_kwargs):
  assert setup_kwargs['license'] == 'Apache-2.0'
  assert setup_kwargs['license_files'] == ['LICENSE']
  assert setup_kwargs['author'] == 'The terraformer Authors'
  assert setup_kwargs['long_description'] == _read('README.md')
  assert setup_kwargs['long_description_content_type'] == 'text/markdown'
  assert {
      'Development Status :: 3 - Alpha',
      'Intended Audience :: Science/Research',
      'License :: OSI Approved :: Apache Software License',
      'Programming Language :: Python :: 3.11',
      'Topic :: Scientific/Engineering :: Artificial Intelligence',
  } <= set(setup_kwargs['classifiers'])
  # The kernels' sources are in the sdist, so a wheel built from it
  # compiles: every .cc and .h of terraformer/kernels, and the extension
  # compiles every .cc.
  import fnmatch  # pylint: disable=import-outside-toplevel
  folder = os.path.join('terraformer', 'kernels')
  sources = sorted(f for f in os.listdir(os.path.join(ROOT, folder))
                   if f.endswith(('.cc', '.h')))
  assert {'ffi.cc', 'isa.h'} <= set(sources)
  patterns = setup_kwargs['package_data']['terraformer.kernels']
  assert [f for f in sources
          if not any(fnmatch.fnmatch(f, p) for p in patterns)] == []
  (extension,) = setup_kwargs['ext_modules']
  assert extension.sources == [os.path.join(folder, f) for f in sources
                               if f.endswith('.cc')]


def test_the_wheel_carries_every_gin_file(setup_kwargs):
  """gin/ travels as the package folder terraformer/gin_configs (an installed
  terraformer.config finds its configs there): every gin file of the
  repository matches one of its package_data patterns."""
  import fnmatch  # pylint: disable=import-outside-toplevel
  assert 'terraformer.gin_configs' in setup_kwargs['packages']
  assert setup_kwargs['package_dir']['terraformer.gin_configs'] == 'gin'
  patterns = setup_kwargs['package_data']['terraformer.gin_configs']
  gin_dir = os.path.join(ROOT, 'gin')
  files = [os.path.relpath(os.path.join(d, f), gin_dir)
           for d, _, names in os.walk(gin_dir) for f in names
           if f.endswith('.gin')]
  assert len(files) > 100
  # fnmatch's * also crosses '/': compare the depth too.
  missed = [f for f in files if not any(
      fnmatch.fnmatch(f, p) and f.count('/') == p.count('/')
      for p in patterns)]
  assert not missed, missed


def test_an_installed_package_reads_its_own_gin_configs(tmp_path):
  """terraformer.config's GIN_DIR: the wheel's terraformer/gin_configs when
  the package has one (site-packages/gin beside it is gin-config's own),
  else the checkout's gin/ beside the package."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  source = os.path.join(ROOT, 'terraformer', 'config.py')

  def gin_dir(root, packaged):
    package = root / 'terraformer'
    package.mkdir(parents=True)
    (root / 'gin').mkdir()  # gin-config's package, or a checkout's gin/
    if packaged:
      (package / 'gin_configs').mkdir()
    copy = package / 'config.py'
    copy.write_text(open(source, encoding='utf-8').read())
    spec = importlib.util.spec_from_file_location('config_copy', copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GIN_DIR

  assert gin_dir(tmp_path / 'site-packages', True) == str(
      tmp_path / 'site-packages' / 'terraformer' / 'gin_configs')
  assert gin_dir(tmp_path / 'checkout', False) == str(
      tmp_path / 'checkout' / 'gin')
