"""Every relative link in README.md and docs/*.md resolves: the file exists and
a #fragment names a heading of the target page (GitHub's anchor rules)."""
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, 'README.md')] + sorted(
    glob.glob(os.path.join(ROOT, 'docs', '*.md')))
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')


def _prose(text):
  """The text without fenced code blocks and inline code spans."""
  text = re.sub(r'^```.*?^```', '', text, flags=re.M | re.S)
  return re.sub(r'`[^`\n]*`', '', text)


def _anchors(path):
  """GitHub's heading anchors: lower case, punctuation dropped, spaces -> '-',
  repeats numbered -1, -2, ..."""
  seen, anchors = {}, set()
  with open(path, encoding='utf-8') as f:
    text = re.sub(r'^```.*?^```', '', f.read(), flags=re.M | re.S)
  for heading in re.findall(r'^#{1,6} +(.+?) *$', text, flags=re.M):
    slug = re.sub(r'[^\w\- ]', '', heading.lower()).replace(' ', '-')
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    anchors.add(slug if n == 0 else f'{slug}-{n}')
  return anchors


def _links(page):
  with open(page, encoding='utf-8') as f:
    targets = LINK.findall(_prose(f.read()))
  return [t for t in targets if not re.match(r'[a-z]+:', t)]


def test_the_pages_exist_and_have_links():
  assert len(PAGES) > 1 and all(_links(p) for p in PAGES)


def _broken(page):
  broken = []
  for target in _links(page):
    path, _, fragment = target.partition('#')
    full = os.path.normpath(
        os.path.join(os.path.dirname(page), path)) if path else page
    if not os.path.exists(full):
      broken.append(f'{target}: no file {os.path.relpath(full, ROOT)}')
    elif fragment and (not full.endswith('.md') or
                       fragment not in _anchors(full)):
      broken.append(f'{target}: no heading #{fragment}')
  return broken


@pytest.mark.parametrize('page', PAGES, ids=os.path.basename)
def test_relative_links_resolve(page):
  assert not _broken(page)


def test_the_check_finds_broken_links(tmp_path):
  (tmp_path / 'b.md').write_text("## Ours vs Trax's x_y (§4.2)\n## Ours vs Trax's x_y (§4.2)\n")
  (tmp_path / 'a.md').write_text(
      '[ok](b.md#ours-vs-traxs-x_y-42) [ok](b.md#ours-vs-traxs-x_y-42-1) '
      '`[code](nowhere.md)` [web](https://example.com) [self](#top)\n'
      '[no file](c.md) [no heading](b.md#ours) ![img](x.png)\n# Top\n')
  assert _broken(str(tmp_path / 'a.md')) == [
      'c.md: no file ' + os.path.relpath(str(tmp_path / 'c.md'), ROOT),
      'b.md#ours: no heading #ours',
      'x.png: no file ' + os.path.relpath(str(tmp_path / 'x.png'), ROOT)]


# The committed exports (tensorboard_exports/NAME/): each is the curves of a
# table on a page, so a page names it, and its index lists it; a name on a
# page or in an experiment script is a folder that exists.
EXPORTS = os.path.join(ROOT, 'tensorboard_exports')
EXPORT_NAME = re.compile(r'tensorboard_exports/([a-z0-9_]+)')


def _export_names(paths):
  """{folder name: [the files of `paths` that name tensorboard_exports/it]}."""
  names = {}
  for path in paths:
    with open(path, encoding='utf-8') as f:
      for name in set(EXPORT_NAME.findall(f.read())):
        names.setdefault(name, []).append(os.path.relpath(path, ROOT))
  return names


def test_each_export_is_named_by_a_page_and_the_index():
  folders = sorted(d for d in os.listdir(EXPORTS)
                   if os.path.isdir(os.path.join(EXPORTS, d)))
  on_pages = _export_names(PAGES)
  assert [d for d in folders if d not in on_pages] == []
  with open(os.path.join(EXPORTS, 'README.md'), encoding='utf-8') as f:
    rows = re.findall(r'^\| `([^`]+)/` \|', f.read(), flags=re.M)
  assert rows == sorted(set(rows), key=rows.index)  # One row each.
  assert sorted(rows) == folders


def test_each_export_named_exists():
  scripts = sorted(glob.glob(os.path.join(ROOT, 'experiments', '*.sh')))
  named = _export_names(PAGES + scripts)
  assert {n: p for n, p in named.items()
          if not os.path.isdir(os.path.join(EXPORTS, n))} == {}
