"""Blockwise (chunked) encoder self-attention: the Pyramidion's baseline.

Pietruszka et al. (ACL 2022) §2, §3.2 (Table 1: l·m·n·d for blocks of m),
App. C.1 ("block size = stride = 512"): the encoder's sequence is cut into
non-overlapping blocks of `block_len` tokens and each token attends only to
the tokens of its own block; blocks do not talk to each other within a layer.
Positions are those of the whole document (added before the encoder).

The authors' code runs unmasked attention inside each chunk; here padding
keys are masked (mask [B, n], True on real tokens). A sequence shorter than
a block is one block (their `chunk = min(T, chunk_size)`); a longer one that
is not a multiple of `block_len` is padded with masked positions and cropped
back.
"""
import gin
import jax
import jax.numpy as jnp
from trax import layers as tl

from terraformer.errors import TerraformerError


def blockwise_attention(q, k, v, mask, n_heads, block_len):
  """Per-block multi-head attention; q, k, v [B, n, D], mask [B, n] -> [B, n, D].

  D = n_heads * d_head, laid out head after head (as `tl.SplitIntoHeads`).
  Scores are scaled by 1/sqrt(d_head) (as `tl.PureAttention`).
  """
  batch, n, d = q.shape
  if d % n_heads:
    raise TerraformerError(f'width {d} is not a multiple of n_heads={n_heads}')
  block = min(n, block_len)
  padded = -(-n // block) * block
  if mask is None:
    mask = jnp.ones((batch, n), dtype=bool)
  if padded != n:
    pad = ((0, 0), (0, padded - n), (0, 0))
    q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
    mask = jnp.pad(mask, ((0, 0), (0, padded - n)))
  n_blocks, d_head = padded // block, d // n_heads

  def blocks(x):                           # [B, nb, block, H, dh]
    return x.reshape(batch, n_blocks, block, n_heads, d_head)

  q, k, v = blocks(q), blocks(k), blocks(v)
  dots = jnp.einsum('bnqhd,bnkhd->bnhqk', q, k) / jnp.sqrt(d_head).astype(
      q.dtype)
  key_mask = mask.reshape(batch, n_blocks, 1, 1, block).astype(bool)
  dots = jnp.where(key_mask, dots, jnp.full_like(dots, -1e9))
  weights = jax.nn.softmax(dots, axis=-1)
  y = jnp.einsum('bnhqk,bnkhd->bnqhd', weights, v)
  return y.reshape(batch, padded, d)[:, :n]


@gin.configurable(module='terraformer')
class BlockwiseAttentionCore(tl.Layer):
  """(q, k, v, mask) -> y: the weightless core, for any Q/K/V projections.

  q, k, v: [B, n, D] with `n_heads` heads laid out along D; mask [B, n].
  """

  def __init__(self, n_heads=8, block_len=512):
    super().__init__(n_in=4, n_out=1, name=f'BlockwiseAttention_{block_len}')
    if block_len < 1:
      raise TerraformerError(f'block_len must be positive, got {block_len}')
    self._n_heads = n_heads
    self._block_len = block_len

  def forward(self, inputs):
    q, k, v, mask = inputs
    return blockwise_attention(q, k, v, mask, self._n_heads, self._block_len)


@gin.configurable(module='terraformer')
def BlockwiseSelfAttention(d_model, n_heads=8, block_len=512):
  """(x, mask) -> y: dense Q, K, V, blockwise core, dense output.

  The projections are `tl.Attention`'s (four `tl.Dense(d_model)`); with one
  block covering the sequence it is full bidirectional attention.
  """
  if d_model % n_heads:
    raise TerraformerError(f'd_model={d_model} is not a multiple of '
                           f'n_heads={n_heads}')
  return tl.Serial(                                    # x mask
      tl.Branch(tl.Dense(d_model), tl.Dense(d_model),
                tl.Dense(d_model)),                    # q k v mask
      BlockwiseAttentionCore(n_heads, block_len),      # y
      tl.Dense(d_model),
      name=f'BlockwiseSelfAttention_{block_len}')
