"""Salient-token extraction: a summarization-like task where selection decides.

For Pyramidion's scorer ablation (Pietruszka et al., App. A, Table 4) on a
task a CPU learns: the input is `input_len` tokens of real text (the aclsum
paper bodies of one split) into which a marker token is inserted before
`n_salient` chosen text tokens; the target is those salient tokens in input
order, then EOS. Nothing else in the input matters, so an encoder that pools
to k < input_len vectors must keep the salient ones (or what carries them):
the first pooling's recall of the salient positions measures the scorer.

The marker is declared by context, not by its id: each example draws one
marker among the SentencePiece pieces that do not occur in its text window
(never pad, EOS or unk), and writes it as the first token of every section
of `declare_every` tokens (None: one section, the whole input). A token is
salient when the token before it is its section's declared marker (and is
not the declaration itself):

  section:  M t_1 t_2 M s_1 t_3 t_4 t_5 M s_2 t_6 ...    (M declared at 0)
  target:   s_1 s_2 ... EOS

So the marker's embedding says nothing by itself (another example's marker
is ordinary text here): a scorer must compare a token's predecessor with the
section's first token, which takes attention, so a scorer that pools right
after the embeddings or after one layer is at a disadvantage (App. C.2's
advice to pool after the first layer). Sections let a blockwise encoder
whose blocks hold whole sections see the declaration in every block.

`fixed_marker=True` makes the marker one id past the text's vocabulary,
`vocab_size` itself, in every example (the model's vocabulary is then
vocab_size + 1): a salient token is then known from its predecessor alone,
one attention step, where the declared marker takes a comparison of two
tokens; the salient token's own embedding still says nothing, so pooling
right after the embeddings must still guess.

`indexed_markers=True` gives each salient token its own marker, one id past
the vocabulary per index: the i-th salient token (in input order, 0-based)
follows the id `vocab_size + i`, and each section's declaration is the
marker of its first salient token (the model's vocabulary is then
vocab_size + n_salient). The i-th output is then found by one content
match, the token after marker i, as a keyed recall's answer is, where one
marker for all takes counting which occurrence an output is (an in-order
copy of m of n tokens that no model learned on the CPU within 3000 steps
from n = 64 up, gin/long_input/scorers/base.gin). A salient token is still
known only from its predecessor, so pooling must still keep it.

`salient_pieces=K` draws the salient tokens among the window's tokens that
are one of the first K pieces of the vocabulary, ids N_SPECIAL .. N_SPECIAL
+ K - 1. SentencePiece orders its pieces by their unigram scores, so these
are about the K most frequent: with K = 64 on the aclsum bodies ("s",
"the", ",", ".", "of", ...), 43.5% of the tokens, where the 64 most
frequent pieces are 43.6%. A copy is then learned as
soon as attention finds the marked positions: the output layer maps K
pieces back, not every piece of the vocabulary, which it learns from the
few times each rare piece is a target (on a 2048-piece vocabulary, a
Transformer did not learn even to copy 4 given positions of random pieces
in 3000 steps; on 29 pieces, in 500). The unmarked text holds the same
pieces everywhere, so only the marker tells the salient ones apart.

Every section holds `n_salient / n_sections` markers, never right after its
declaration (so position 1 of a section is text), none in a row; the text
between them is one contiguous window of the split's concatenated bodies, in
order. Validation and test text comes from papers of other splits than
train's (`aclsum_papers.split_of`); each split draws from its own random
stream, deterministic per seed.
"""
import gin
import numpy as np

from terraformer.data import aclsum_papers
from terraformer.data import vocab as vocab_lib
from terraformer.errors import TerraformerError

SPLITS = ('train', 'validation', 'test')
# SentencePiece ids never used as the marker: pad, EOS, unk (vocab.py).
N_SPECIAL = 3


class Layout:
  """Lengths of one task configuration: sections and their markers."""

  def __init__(self, input_len, n_salient, declare_every=None):
    for name, value in dict(input_len=input_len, n_salient=n_salient).items():
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TerraformerError(
            f'{name} must be a positive integer, got {value!r}')
    section = input_len if declare_every is None else declare_every
    if (isinstance(section, bool) or not isinstance(section, int)
        or section < 3 or input_len % section):
      raise TerraformerError(
          f'declare_every must be an integer >= 3 that divides input_len='
          f'{input_len} (or None), got {declare_every!r}')
    n_sections = input_len // section
    if n_salient % n_sections:
      raise TerraformerError(
          f'n_salient={n_salient} must be a multiple of the {n_sections} '
          f'sections of {section} tokens (each holds as many markers)')
    per_section = n_salient // n_sections
    # A section: declaration, then text with a marker before per_section of
    # its tokens, never the first: text = section - 1 - per_section tokens.
    text_len = section - 1 - per_section
    if per_section > text_len - 1:
      raise TerraformerError(
          f'sections of {section} tokens are too short for {per_section} '
          f'salient tokens each')
    self.input_len = input_len
    self.n_salient = n_salient
    self.section = section
    self.n_sections = n_sections
    self.per_section = per_section
    self.text_len = text_len
    self.target_len = n_salient + 1


# Windows drawn for one example before `salient_pieces` gives up (a window
# with too few frequent pieces in a section is drawn again).
MAX_WINDOWS = 100


def make_example(rng, text, layout, vocab_size, eos_id, fixed_marker=False,
                 salient_pieces=None, indexed_markers=False):
  """One example from a random window of `text` (token ids).

  The marker is drawn among the pieces absent from the window, or is
  `vocab_size` with `fixed_marker`; with `indexed_markers` the i-th salient
  token's is `vocab_size + i`. With `salient_pieces` K, the salient tokens
  are drawn among the window's ids below N_SPECIAL + K.

  Returns:
    (input ids [input_len], target ids [n_salient + 1], info) where info
    holds `marker` (the id; with `indexed_markers` the first one),
    `salient_pos` and `marker_pos` (input positions, ascending) and
    `window_start` (where the text window starts in `text`).
  """
  n_text = layout.n_sections * layout.text_len
  # Salient candidates of a section's text chunk: never its first token
  # (it follows the declaration), so no marker stands right after it.
  candidates = lambda chunk: 1 + np.flatnonzero(
      chunk[1:] < N_SPECIAL + salient_pieces) if salient_pieces else (
          np.arange(1, layout.text_len))
  for _ in range(MAX_WINDOWS):
    start = int(rng.integers(0, len(text) - n_text + 1))
    window = np.asarray(text[start:start + n_text], np.int32)
    chunks = window.reshape(layout.n_sections, layout.text_len)
    if all(len(candidates(c)) >= layout.per_section for c in chunks):
      break
  else:
    raise TerraformerError(
        f'{MAX_WINDOWS} windows of the text had a section with fewer than '
        f'{layout.per_section} tokens among the first {salient_pieces} pieces '
        f'of the vocabulary (salient_pieces)')
  if fixed_marker or indexed_markers:
    marker = vocab_size
  else:
    absent = np.setdiff1d(np.arange(N_SPECIAL, vocab_size), window)
    if not absent.size:
      raise TerraformerError(
          f'every piece of the {vocab_size}-piece vocabulary occurs in a '
          f'{n_text}-token window: no marker left')
    marker = int(rng.choice(absent))
  ids = np.empty(layout.input_len, np.int32)
  salient = []
  for s, chunk in enumerate(chunks):
    chosen = np.sort(rng.choice(candidates(chunk), size=layout.per_section,
                                replace=False))
    base = s * layout.section
    first = marker + s * layout.per_section if indexed_markers else marker
    ids[base] = first
    # Chunk token j lands after the declaration and the markers inserted
    # before it: position 1 + j + (markers before or at j).
    shift = np.searchsorted(chosen, np.arange(layout.text_len), side='right')
    at = base + 1 + np.arange(layout.text_len) + shift
    ids[at] = chunk
    salient_at = at[chosen]
    ids[salient_at - 1] = (first + np.arange(layout.per_section)
                           if indexed_markers else marker)
    salient.append(salient_at)
  salient_pos = np.concatenate(salient)
  target = np.concatenate([ids[salient_pos], [eos_id]]).astype(np.int32)
  info = dict(marker=marker, salient_pos=salient_pos,
              marker_pos=salient_pos - 1, window_start=start)
  return ids, target, info


def salient_positions(inputs, declare_every=None, markers_from=None):
  """The salient positions of input rows, read off the tokens alone.

  A position p is salient when p - 1 holds the marker declared at the
  start of p's section (with `markers_from`, indexed markers: any id from
  `markers_from` on) and p - 1 is not that declaration.

  Args:
    inputs: [B, input_len] token ids (or one row [input_len]).
    declare_every: the stream's section length (None: the whole input).
    markers_from: None, or the first marker id of indexed markers (the
      stream's vocab_size).

  Returns:
    A bool array of the inputs' shape, True on salient positions.
  """
  inputs = np.asarray(inputs)
  one_row = inputs.ndim == 1
  inputs = np.atleast_2d(inputs)
  n = inputs.shape[1]
  section = n if declare_every is None else declare_every
  offset = np.arange(n) % section
  declared = inputs[:, np.arange(n) - offset]  # Each position's marker.
  previous = np.concatenate([inputs[:, :1], inputs[:, :-1]], axis=1)
  is_marker = (previous == declared if markers_from is None
               else previous >= markers_from)
  salient = (offset >= 2) & is_marker
  return salient[0] if one_row else salient


def _text(split, vocab_size, vocab_path, papers_dir):
  """(one split's paper bodies as one token array, vocab)."""
  vocab = vocab_lib.get_vocab(vocab_size, vocab_path, papers_dir)
  if vocab.vocab_size != vocab_size:
    raise TerraformerError(
        f'vocab has {vocab.vocab_size} pieces, vocab_size={vocab_size}')
  papers = aclsum_papers.load_split(split, papers_dir)
  docs = vocab.encode_batch(p['body'] for p in papers)
  return np.concatenate([np.asarray(d, np.int32) for d in docs]), vocab


def examples(split='train', input_len=512, n_salient=16, vocab_size=2048,
             vocab_path=None, papers_dir=None, seed=0, declare_every=None,
             fixed_marker=False, salient_pieces=None, indexed_markers=False,
             stage=0, text_and_vocab=None):
  """(layout, endless generator of (inputs, target, info) examples).

  `stage` > 0 draws from another random stream (a length stage's);
  `text_and_vocab`, if given, is `_text(split, vocab_size, ...)` already
  read (a stream's stages share one reading).
  """
  if fixed_marker and indexed_markers:
    raise TerraformerError(
        'fixed_marker and indexed_markers are two kinds of marker: set one')
  if salient_pieces is not None and (
      isinstance(salient_pieces, bool) or not isinstance(salient_pieces, int)
      or not 1 <= salient_pieces <= vocab_size - N_SPECIAL):
    most = vocab_size - N_SPECIAL
    raise TerraformerError(
        f'salient_pieces must be None or an integer in 1..{most}, got '
        f'{salient_pieces!r}')
  if split not in SPLITS:
    raise TerraformerError(f'split must be one of {SPLITS}, got {split!r}')
  layout = Layout(input_len, n_salient, declare_every)
  text, vocab = text_and_vocab or _text(split, vocab_size, vocab_path,
                                       papers_dir)
  if len(text) < layout.n_sections * layout.text_len:
    raise TerraformerError(
        f'split {split!r} has {len(text)} tokens of text, fewer than the '
        f'{layout.n_sections * layout.text_len} an input of {input_len} '
        f'holds')
  rng = np.random.default_rng([seed, SPLITS.index(split)]
                              + ([stage] if stage else []))

  def generate():
    while True:
      yield make_example(rng, text, layout, vocab_size, vocab.eos_id,
                         fixed_marker, salient_pieces, indexed_markers)

  return layout, generate()


@gin.configurable(module='terraformer.data')
def salient_extraction_stream(split='train', input_len=512, n_salient=16,
                              batch_size=16, vocab_size=2048,
                              vocab_path=None, papers_dir=None, seed=0,
                              declare_every=None, fixed_marker=False,
                              salient_pieces=None, indexed_markers=False,
                              length_stages=()):
  """Returns an endless generator of salient-extraction batches.

  Args:
    split: papers split the text comes from ('train', 'validation',
      'test'); each split draws from its own random stream.
    input_len: input tokens (N).
    n_salient: salient tokens per example (m), the target's length less EOS.
    batch_size: examples per batch.
    vocab_size, vocab_path, papers_dir: as `lm_stream`; the task adds no
      ids (the marker is a piece of the vocabulary).
    seed: random seed (deterministic: same seed, same batches).
    declare_every: section length: the marker is declared at the start of
      every section and each section holds n_salient / sections salient
      tokens; None: one section.
    fixed_marker: the marker is `vocab_size` in every example (the model
      then has vocab_size + 1 ids), not a piece absent from the window.
    salient_pieces: None, or K: the salient tokens are among the first K
      pieces of the vocabulary (ids N_SPECIAL .. N_SPECIAL + K - 1, about
      the K most frequent).
    indexed_markers: the i-th salient token follows the id vocab_size + i
      (the model then has vocab_size + n_salient ids).
    length_stages: a length curriculum: `((input_len, batches), ...)`
      yielded in order before the endless batches of `input_len`, each
      stage from its own random stream (the batches after the stages are
      those of a stream without them). A stage `(input_len, batches,
      n_salient)` also sets its salient tokens (targets of n_salient + 1;
      with `indexed_markers` the model needs vocab_size + the largest
      n_salient ids). Pooling passes inputs of at most k vectors unchanged,
      so stages no longer than k train a pooled model unpooled and leave
      its scorer untrained.

  Returns:
    A generator of `(inputs [B, input_len], targets [B, n_salient + 1],
    weights [B, n_salient + 1])`, int32/int32/float32, weights all 1
    (a stage's input_len and n_salient during `length_stages`).
  """
  if isinstance(batch_size, bool) or not isinstance(
      batch_size, int) or batch_size < 1:
    raise TerraformerError(
        f'batch_size must be a positive integer, got {batch_size!r}')
  stages = _length_stages(length_stages, n_salient)
  text_and_vocab = _text(split, vocab_size, vocab_path, papers_dir)
  make = lambda length, m, stage: examples(
      split, length, m, vocab_size, vocab_path, papers_dir, seed,
      declare_every, fixed_marker, salient_pieces, indexed_markers,
      stage, text_and_vocab)[1]
  # Built before yielding, so a bad stage fails at once, not at its turn.
  staged = [(make(length, m, i + 1), n, m)
            for i, (length, n, m) in enumerate(stages)]
  stream = make(input_len, n_salient, 0)

  def batch(examples_, m):
    pairs = [next(examples_)[:2] for _ in range(batch_size)]
    return (np.stack([x for x, _ in pairs]), np.stack([y for _, y in pairs]),
            np.ones((batch_size, m + 1), np.float32))

  def batches():
    for stage_stream, n, m in staged:
      for _ in range(n):
        yield batch(stage_stream, m)
    while True:
      yield batch(stream, n_salient)

  return batches()


def _length_stages(length_stages, n_salient):
  """`length_stages` checked, as (input_len, batches, n_salient) triples."""
  if not isinstance(length_stages, (list, tuple)):
    stages = (length_stages,)
  else:
    stages = tuple(tuple(s) if isinstance(s, (list, tuple)) else s
                   for s in length_stages)
  for stage in stages:
    if (not isinstance(stage, tuple) or len(stage) not in (2, 3)
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
               for v in stage)):
      raise TerraformerError(
          f'length_stages must be (input_len, batches) pairs or (input_len, '
          f'batches, n_salient) triples of positive integers, got '
          f'{length_stages!r}')
  return tuple(s if len(s) == 3 else s + (n_salient,) for s in stages)
