"""Long-range recall: split key -> value facts in papers filler.

A synthetic encoder-decoder task that a model can only solve by relating
tokens far apart. Each example is `input_len` tokens of real text from the
papers corpus (filler) with k facts written into it, each split in two
halves linked by a tag:

  first half of the input  (region A):  ... K_j T_j ...     key, tag
  second half of the input (region B):  ... T_j V_j ...     tag, value
  the last k + 2 tokens:                Q K_q1 ... K_qk EOS   the queries

and the target is the values of the queried keys, in query order:
`V_q1 ... V_qk EOS`. Keys, tags, values and the query mark are extra
symbols above the SentencePiece vocabulary, so filler never contains them.
Within an example keys and tags are distinct; the facts sit in a random
order in A, in another random order in B, and are queried in a third order
that differs from their order in A.

Why it needs range: every key is in the first half of the input and its
value in the second (region A ends at `input_len // 2`, region B starts
there; on average they are ~input_len / 2 tokens apart), and only the tag
ties them together. A full-attention encoder can join the two
halves in one layer (T_j in B attends to the same tag in A and picks up K_j)
and the decoder then needs one lookup by key. An encoder whose attention
blocks lie inside one region (blockwise, `block_len <= input_len // 2`)
cannot join them; its 2-layer decoder would need three dependent
cross-attention lookups (query i -> key -> tag -> value). Pooling between
blockwise layers (Pyramidion) shortens the sequence, so a later block spans
both regions again.

With `link='adjacent'` a fact is one piece, `K_j V_j`, in region A, and region
B is filler only: the one long-range step is from a query to its key (the
encoder carries the value into the query's position, or a decoder chains
query -> key -> value itself). With one decoder layer, which can make one
cross-attention lookup per output token and so cannot chain two, only an
encoder that sees a query and its key in one attention reaches the value
(blockwise blocks of `<= input_len // 2` cannot).

With `link='fused'` a fact is one token of its own, the id of its (key, value)
pair (`n_keys * n_values` more ids), in region A: the query (or, with
`keyed_answer`, the answer position) finds it by one content match, with no
previous-token step to learn first (the step that the two-token facts above
need and that no model learned on the CPU, docs/long-input-quality.md). The
range argument is that of 'adjacent'.

With `keyed_answer=True` the target repeats each queried key before its
value, `K_q1 V_q1 ... K_qk V_qk EOS`, with weight 0 on the keys: the answer
position holds the key it asks for, so the lookup is one match of that key
against the input (an induction-head lookup in an LM).

`long_range_recall_lm_stream` is the same examples as one causal sequence
(input then target) for decoder-only LMs, weighted on the answer tokens.
"""
import gin
import numpy as np

from terraformer.data import aclsum_papers
from terraformer.data import vocab as vocab_lib
from terraformer.errors import TerraformerError

SPLITS = ('train', 'validation', 'test')


def n_symbols(n_keys, n_tags, n_values, link='tag'):
  """How many ids the task adds above the SentencePiece vocabulary: the query
  mark, keys, tags, values and, with `link='fused'`, one id per (key, value)."""
  fused = n_keys * n_values if link == 'fused' else 0
  return 1 + n_keys + n_tags + n_values + fused


def model_vocab_size(vocab_size, n_keys, n_tags, n_values, link='tag'):
  """The (input and output) vocabulary size a model needs for the task."""
  return vocab_size + n_symbols(n_keys, n_tags, n_values, link)


LINKS = ('tag', 'adjacent', 'fused')


def _check(input_len, n_facts, n_keys, n_tags, n_values, value_len,
           batch_size, link='tag'):
  for name, value in dict(input_len=input_len, n_facts=n_facts,
                          n_keys=n_keys, n_tags=n_tags, n_values=n_values,
                          value_len=value_len,
                          batch_size=batch_size).items():
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise TerraformerError(
          f'{name} must be a positive integer, got {value!r}')
  if n_facts < 2:
    raise TerraformerError(
        f'n_facts must be at least 2 (queries in a new order), got {n_facts}')
  if n_keys < n_facts or n_tags < n_facts:
    raise TerraformerError(
        f'n_keys={n_keys} and n_tags={n_tags} must be >= n_facts={n_facts} '
        '(distinct within an example)')
  if link not in LINKS:
    raise TerraformerError(f'link must be one of {LINKS}, got {link!r}')
  half = input_len // 2
  if link == 'fused' and value_len != 1:
    raise TerraformerError(
        f"link='fused' writes a fact as one token: value_len must be 1, got"
        f' {value_len}')
  need_a = n_facts * {'tag': 2, 'adjacent': 1 + value_len, 'fused': 1}[link]
  need_b = n_facts * (1 + value_len if link == 'tag' else 0) + n_facts + 2
  if need_a > half or need_b > input_len - half:
    raise TerraformerError(
        f'input_len={input_len} is too short for {n_facts} facts with values'
        f' of {value_len} tokens')


class Layout:
  """The symbol ids and lengths of one task configuration."""

  def __init__(self, vocab_size, input_len, n_facts, n_keys, n_tags,
               n_values, value_len, link='tag', keyed_answer=False):
    self.link = link
    self.keyed_answer = keyed_answer
    self.input_len = input_len
    self.n_facts = n_facts
    self.value_len = value_len
    self.query_mark = vocab_size
    self.keys = vocab_size + 1 + np.arange(n_keys)
    self.tags = self.keys[-1] + 1 + np.arange(n_tags)
    self.values = self.tags[-1] + 1 + np.arange(n_values)
    # link='fused': fact (key i, value j) is the one id fused[i, j].
    self.fused = (self.values[-1] + 1 + np.arange(n_keys * n_values)).reshape(
        n_keys, n_values)
    self.target_len = target_len(n_facts, value_len, keyed_answer)
    # Weight 1 on the values and EOS, 0 on the repeated keys.
    self.target_weights = np.ones(self.target_len, np.float32)
    if keyed_answer:
      self.target_weights[:-1:1 + value_len] = 0.0
    self.region_b = input_len // 2               # Region A: [0, region_b).
    self.query_start = input_len - n_facts - 2   # Region B: [region_b, here).

  def _slots(self, rng, start, stop, width, n):
    """n random non-overlapping starts of `width` tokens in [start, stop)."""
    n_slots = (stop - start) // width
    slots = np.sort(rng.choice(n_slots, size=n, replace=False))
    return start + slots * width


def make_example(rng, filler, layout, eos_id):
  """One example from a random filler window.

  Returns:
    (input ids [input_len], target ids [target_len], info) where info holds
    `key_pos`, `value_pos` (per fact, in fact order), `query_order` and the
    fact `keys`, `tags`, `values` (so tests can check the layout).
  """
  k, vlen = layout.n_facts, layout.value_len
  start = int(rng.integers(0, len(filler) - layout.input_len + 1))
  ids = np.array(filler[start:start + layout.input_len], np.int32)
  keys = rng.choice(layout.keys, size=k, replace=False)
  tags = rng.choice(layout.tags, size=k, replace=False)
  values = rng.choice(layout.values, size=(k, vlen))
  # Facts in a random order in each region: slot i of A holds fact order_a[i].
  order_a, order_b = rng.permutation(k), rng.permutation(k)
  query = rng.permutation(k)
  while np.array_equal(query, order_a):
    query = rng.permutation(k)
  key_pos = np.zeros(k, np.int64)
  value_pos = np.zeros(k, np.int64)
  if layout.link == 'fused':  # One token per fact in region A.
    key_index = keys - layout.keys[0]
    value_index = values[:, 0] - layout.values[0]
    for slot, fact in zip(layout._slots(rng, 0, layout.region_b, 1, k),
                          order_a):
      ids[slot] = layout.fused[key_index[fact], value_index[fact]]
      key_pos[fact] = value_pos[fact] = slot
  elif layout.link == 'adjacent':  # K_j V_j in region A, B is filler.
    for slot, fact in zip(layout._slots(rng, 0, layout.region_b, 1 + vlen,
                                        k), order_a):
      ids[slot] = keys[fact]
      ids[slot + 1:slot + 1 + vlen] = values[fact]
      key_pos[fact], value_pos[fact] = slot, slot + 1
  else:
    for slot, fact in zip(layout._slots(rng, 0, layout.region_b, 2, k),
                          order_a):
      ids[slot:slot + 2] = keys[fact], tags[fact]
      key_pos[fact] = slot
    for slot, fact in zip(layout._slots(rng, layout.region_b,
                                        layout.query_start, 1 + vlen, k),
                          order_b):
      ids[slot] = tags[fact]
      ids[slot + 1:slot + 1 + vlen] = values[fact]
      value_pos[fact] = slot + 1
  ids[layout.query_start] = layout.query_mark
  ids[layout.query_start + 1:layout.query_start + 1 + k] = keys[query]
  ids[-1] = eos_id
  answer = values[query]
  if layout.keyed_answer:
    answer = np.concatenate([keys[query][:, None], answer], axis=1)
  target = np.concatenate([answer.reshape(-1), [eos_id]]).astype(np.int32)
  info = dict(key_pos=key_pos, value_pos=value_pos, query_order=query,
              fact_order_a=order_a, keys=keys, tags=tags, values=values)
  return ids, target, info


def _filler(split, vocab_size, vocab_path, papers_dir, input_len):
  vocab = vocab_lib.get_vocab(vocab_size, vocab_path, papers_dir)
  papers = aclsum_papers.load_split(split, papers_dir)
  docs = vocab.encode_batch(p['body'] for p in papers)
  filler = np.concatenate([np.asarray(d, np.int32) for d in docs])
  if len(filler) < input_len:
    raise TerraformerError(
        f'split {split!r} has {len(filler)} tokens of text, fewer than '
        f'input_len={input_len}')
  return filler, vocab


def target_len(n_facts, value_len, keyed_answer=False):
  """Target tokens: the k answers (each its value, after its key if keyed)
  and EOS."""
  return n_facts * (value_len + int(bool(keyed_answer))) + 1


def _examples(split, input_len, n_facts, n_keys, n_tags, n_values, value_len,
              batch_size, vocab_size, vocab_path, papers_dir, seed, link,
              keyed_answer):
  """(layout, generator of lists of batch_size (input, target) pairs)."""
  _check(input_len, n_facts, n_keys, n_tags, n_values, value_len, batch_size,
         link)
  if split not in SPLITS:
    raise TerraformerError(f'split must be one of {SPLITS}, got {split!r}')
  filler, vocab = _filler(split, vocab_size, vocab_path, papers_dir,
                          input_len)
  if vocab.vocab_size != vocab_size:
    raise TerraformerError(
        f'vocab has {vocab.vocab_size} pieces, vocab_size={vocab_size}')
  layout = Layout(vocab_size, input_len, n_facts, n_keys, n_tags, n_values,
                  value_len, link, keyed_answer)
  rng = np.random.default_rng([seed, SPLITS.index(split)])

  def batches():
    while True:
      yield [make_example(rng, filler, layout, vocab.eos_id)[:2]
             for _ in range(batch_size)]

  return layout, batches()


@gin.configurable(module='terraformer.data')
def long_range_recall_stream(split='train', input_len=512, n_facts=4,
                             n_keys=64, n_tags=64, n_values=64, value_len=1,
                             batch_size=8, vocab_size=2048, vocab_path=None,
                             papers_dir=None, seed=0, target_pad_to=None,
                             link='tag', keyed_answer=False, key_weight=0.0):
  """Returns an endless generator of encoder-decoder recall batches.

  Args:
    split: papers split the filler comes from ('train', 'validation',
      'test'); each split also draws its facts from its own random stream.
    input_len: input tokens (filler + facts + queries + EOS).
    n_facts: facts per example (k).
    n_keys, n_tags, n_values: sizes of the key, tag and value alphabets.
    value_len: tokens per value.
    batch_size: examples per batch.
    vocab_size: SentencePiece pieces of the filler; the task's symbols take
      ids from `vocab_size` on, so the model needs
      `model_vocab_size(vocab_size, n_keys, n_tags, n_values, link)` ids.
    vocab_path, papers_dir: as `lm_stream`.
    seed: random seed (deterministic: same seed, same batches).
    target_pad_to: zero-pad targets (weight 0) to this length, e.g. so that
      an LSH chunk divides input_len + target length; None: no padding.
    link: 'tag' (key and tag in the first half, tag and value in the
      second), 'adjacent' (key and value side by side in the first half) or
      'fused' (each fact one token in the first half; see the module
      docstring).
    keyed_answer: the target repeats each queried key (weight 0) before its
      value (see the module docstring).
    key_weight: with `keyed_answer`, the weight of the repeated keys: 0
      scores the values only; > 0 also asks the model to write the queried
      keys in query order, which only the input's queries tell (so an
      encoder that pools must keep them).

  Returns:
    A generator of `(inputs [B, input_len], targets [B, n_facts * value_len
    + 1 or target_pad_to], weights)`, int32/int32/float32, weights 1 on the
    values and EOS, `key_weight` on repeated keys, 0 on padding.
  """
  if isinstance(key_weight, bool) or not isinstance(
      key_weight, (int, float)) or not 0 <= key_weight < float('inf') or (
          key_weight and not keyed_answer):
    raise TerraformerError(
        f'key_weight must be a finite number >= 0, and 0 without '
        f'keyed_answer; got {key_weight!r} (keyed_answer={keyed_answer!r})')
  layout, examples = _examples(split, input_len, n_facts, n_keys, n_tags,
                               n_values, value_len, batch_size, vocab_size,
                               vocab_path, papers_dir, seed, link,
                               keyed_answer)
  padded_len = layout.target_len
  if target_pad_to is not None:
    if isinstance(target_pad_to, bool) or not isinstance(
        target_pad_to, int) or target_pad_to < layout.target_len:
      raise TerraformerError(
          f'target_pad_to must be an integer >= {layout.target_len}, got '
          f'{target_pad_to!r}')
    padded_len = target_pad_to
  target_weights = layout.target_weights.copy()
  if keyed_answer:
    target_weights[:-1:1 + value_len] = key_weight

  def batches():
    for pairs in examples:
      inputs = np.stack([x for x, _ in pairs])
      targets = np.zeros((batch_size, padded_len), np.int32)
      weights = np.zeros((batch_size, padded_len), np.float32)
      targets[:, :layout.target_len] = np.stack([y for _, y in pairs])
      weights[:, :layout.target_len] = target_weights
      yield inputs, targets, weights

  return batches()


@gin.configurable(module='terraformer.data')
def long_range_recall_lm_stream(split='train', seq_len=512, n_facts=4,
                                n_keys=64, n_tags=64, n_values=64,
                                value_len=1, batch_size=8, vocab_size=2048,
                                vocab_path=None, papers_dir=None, seed=0,
                                weight_filler=False, link='tag',
                                keyed_answer=False):
  """The recall examples as causal LM sequences: input, then target.

  Each row is one example of input length `seq_len - target_len(n_facts,
  value_len, keyed_answer)` followed by its target, so it is `seq_len` tokens
  long; the target's tokens are weighted as in `long_range_recall_stream`.

  Args:
    seq_len: tokens per row.
    weight_filler: also weight the input tokens (default: only the answer
      tokens count, so log-perplexity measures recall alone).
    Others: as `long_range_recall_stream`.

  Returns:
    A generator of `(tokens, tokens, weights)`, each `(batch_size, seq_len)`.
  """
  answer_len = target_len(n_facts, value_len, keyed_answer)
  if isinstance(seq_len, bool) or not isinstance(seq_len, int) or (
      seq_len <= answer_len):
    raise TerraformerError(
        f'seq_len must be an integer > {answer_len}, got {seq_len!r}')
  layout, examples = _examples(split, seq_len - answer_len, n_facts, n_keys,
                               n_tags, n_values, value_len, batch_size,
                               vocab_size, vocab_path, papers_dir, seed, link,
                               keyed_answer)
  weights = np.zeros((batch_size, seq_len), np.float32)
  weights[:, seq_len - answer_len:] = layout.target_weights
  if weight_filler:
    weights[:] = 1.0

  def batches():
    for pairs in examples:
      tokens = np.stack([np.concatenate([x, y]) for x, y in pairs])
      yield tokens, tokens, weights.copy()

  return batches()
