"""A causal convolution over the last few positions, before attention.

Not in the three source papers: a deliberate alternative behind the
`local_conv_len` switch of the Scaling Transformer models (0, the papers'
models, leaves it out). Sparse QKV (§3.2) convolves its queries, keys and
values over F = 3 positions, so a key already holds the tokens just before
it; that is what lets a 2-layer model learn the associative-recall lookup
of docs/long-input-quality.md in ~1500 steps, where dense Q/K/V must first
grow a previous-token head and stay on a plateau. `LocalConv` gives any
attention (full, blockwise, composite slice, pooled) the same local view as
its own residual sublayer, so that attentions of different reach compare on
equal terms (the short convolutions of H3 and Primer play this role).
"""
import gin

from terraformer.layers.sparse_qkv_attention import ModuleConv


@gin.configurable(module='terraformer')
def LocalConv(d_model, kernel_size=3, mode='train'):
  """x -> y, [batch, length, d_model]: y_t = b + sum_j W_j x_{t-j}.

  j = 0 .. kernel_size - 1, W_j full d_model x d_model matrices: sparse QKV's
  `ModuleConv` with one module of width d_model, causal (each position sees
  itself and the kernel_size - 1 before it; predict mode keeps those as
  state, so decoding step by step equals the whole-sequence forward).
  """
  return ModuleConv(1, d_model, kernel_size, module_kernel_sizes=(1,),
                    length_padding='causal', mode=mode)
