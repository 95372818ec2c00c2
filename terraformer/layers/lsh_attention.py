"""Self-attention whose mechanism, full or LSH (Reformer), is a switch (§4).

`SelfAttention` builds the attention of a Terraformer block from three parts:

  projections   dense Q, K, V (+ a dense output layer), or the sparse QKV of
                §3.2 (multiplicative layer + convolution, no output layer);
  core          full dot-product attention, or LSH attention (Reformer:
                queries and keys share one vector, qk = (q + k) / 2, hashed
                into buckets; each position attends within its chunk of the
                bucket-sorted sequence and the chunk before it, and the one
                after it in a bidirectional encoder);
  merge         heads back to d_model.

Both cores have no weights, so a model pre-trained with full attention on
short sequences can be fine-tuned with LSH attention on long ones from the
same checkpoint.

`LSHCore` is Trax's `PureLSHSelfAttention` with one addition for reversible
layers: its buckets are a discrete decision, stored in its state by the
forward pass, and `replay_state` makes a re-run reuse them (§4.2,
`terraformer.layers.reversible`).
"""
from trax import layers as tl
from trax.layers.research import efficient_attention

from terraformer.layers.sparse_qkv_attention import SparseQKV

_REPLAY = 'replay'
ATTENTION_TYPES = ('full', 'lsh')


class LSHCore(efficient_attention.PureLSHSelfAttention):
  """LSH attention on (qk, v[, mask]) split into heads; replays its buckets.

  Inputs qk, v: [batch * n_heads, length, d_head]; mask (bidirectional only):
  [batch, length], True on real tokens. Output like v.
  """

  def forward(self, inputs):
    if isinstance(self.state, dict) and _REPLAY in self.state:
      stored = self.state[_REPLAY]
      output, _, _ = self.forward_and_or_backward(
          inputs, stored, self.rng, compute_output=True, update_state=False)
      self.state = stored
      return output
    return super().forward(inputs)

  def replay_state(self, state, new_state):
    """State under which `forward` reuses the buckets in `new_state`."""
    del state
    return {_REPLAY: new_state}


def SelfAttention(d_model, n_heads, attention_type='full',
                  attention_sparsity=0, attention_kernel_size=3, causal=True,
                  dropout=0.0, lsh_chunk_len=128, lsh_n_hashes=1,
                  lsh_n_buckets=None, predict_mem_len=2048,
                  predict_drop_len=256, mode='train'):
  """Self-attention: causal `x -> y`, bidirectional `(x, mask) -> y`.

  Args:
    d_model: width of x and y.
    n_heads: number of heads with dense projections; sparse QKV has
      `attention_sparsity` heads (one per module, §3.2).
    attention_type: 'full' or 'lsh'.
    attention_sparsity: S > 0: sparse QKV with S modules; 0: dense.
    attention_kernel_size: sparse QKV convolution size F.
    causal: decoder (causal) or encoder (bidirectional, padding mask
      [batch, length] with True on tokens).
    dropout: attention dropout.
    lsh_chunk_len: LSH chunk length (divides the sequence length).
    lsh_n_hashes: LSH rounds of hashing.
    lsh_n_buckets: LSH buckets per round; None: 2 * length / chunk_len.
    predict_mem_len: positions kept by a decoding cache (the encoder length
      plus the target length, to keep them all).
    predict_drop_len: positions LSH drops when its cache is full.
    mode: 'train', 'eval' or 'predict'.
  """
  if attention_type not in ATTENTION_TYPES:
    raise ValueError(f'attention_type must be one of {ATTENTION_TYPES}, got '
                     f'{attention_type!r}')
  if attention_sparsity:
    heads = attention_sparsity
    projections = SparseQKV(d_model, attention_sparsity,
                            attention_kernel_size, 3, causal=causal,
                            mode=mode)
    output = []
  else:
    heads = n_heads
    projections = tl.Branch(tl.Dense(d_model), tl.Dense(d_model),
                            tl.Dense(d_model))
    output = tl.Dense(d_model)
  if d_model % heads:
    raise ValueError(f'd_model={d_model} is not a multiple of the number of '
                     f'heads ({heads}).')
  d_head = d_model // heads
  split = tl.SplitIntoHeads(heads)

  if attention_type == 'lsh':
    core = [
        tl.Fn('SharedQK', lambda q, k: (q + k) / 2, n_out=1),   # qk v [mask]
        tl.Parallel(split, split),
        LSHCore(n_heads=heads, d_qk=d_head, d_v=d_head, causal=causal,
                masked=not causal, chunk_len=lsh_chunk_len,
                n_chunks_before=1, n_chunks_after=0 if causal else 1,
                n_hashes=lsh_n_hashes, n_buckets=lsh_n_buckets, mode=mode,
                predict_mem_len=predict_mem_len,
                predict_drop_len=predict_drop_len,
                attention_dropout=dropout),
        tl.MergeHeads(heads),
    ]
  elif causal:
    core = [
        tl.Parallel(split, split, split),
        tl.DotProductCausalAttention(dropout=dropout,
                                     max_inference_length=predict_mem_len,
                                     mode=mode),
        tl.MergeHeads(heads),
    ]
  else:
    core = [                                     # q k v mask
        tl.Parallel([], [], [], tl.Fn('AttentionMask',
                                      lambda m: m[:, None, None, :])),
        tl.PureAttention(n_heads=heads, dropout=dropout, mode=mode),
        tl.Select([0], n_in=2),
    ]
  return tl.Serial(projections, core, output,
                   name=f'{attention_type.upper()}SelfAttention')
