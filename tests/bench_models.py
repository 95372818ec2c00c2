"""Tiny Scaling Transformers for the benchmark tests, built or as gin text.

The same small shapes (vocab 64, d_model 32, 2 blocks, sparse FF N = 8,
sparse QKV and loss S = 4) serve tests/benchmarks (the decode timer, the
bytes model, the weights factory, the gin configs) and the terraformer-bench
CLI tests, so hand counts and tables are checked on one model family.
"""
import numpy as np

from terraformer.models import ScalingTransformer
import numpy as np

from terraformer.models import ScalingTransformerLM

V, D, D_FF, HEADS, MAX_LEN, LOWRANK = 64, 32, 64, 4, 128, 4
N, S, F, S_LOSS = 8, 4, 3, 4
SPARSE = dict(ff_sparsity=N, attention_sparsity=S, attention_kernel_size=F,
              loss_sparsity=S_LOSS)


def lm(n_layers=2, mode='predict', **sparsity):
  """A ScalingTransformerLM of the shapes above (`sparsity`: SPARSE or not)."""
  return ScalingTransformerLM(vocab_size=V, d_model=D, d_ff=D_FF,
                              n_layers=n_layers, n_heads=HEADS, dropout=0.0,
                              max_len=MAX_LEN, d_lowrank=LOWRANK, mode=mode,
                              **sparsity)


def encdec(n_layers=2, mode='predict', **sparsity):
  """A ScalingTransformer of the shapes above, one encoder block."""
  return ScalingTransformer(input_vocab_size=V, d_model=D, d_ff=D_FF,
                            n_encoder_layers=1, n_decoder_layers=n_layers,
                            n_heads=HEADS, dropout=0.0, max_len=MAX_LEN,
                            d_lowrank=LOWRANK, mode=mode, **sparsity)


def random_tokens(shape, seed):
  """Random token ids in 1..V-1 (int32)."""
  return np.random.RandomState(seed).randint(1, V, size=shape).astype(
      np.int32)


# The dense LM as a gin config (the model bound to terraformer.train.model),
# and the bindings that make it sparse (FF, QKV and loss).
LM_GIN = f"""
terraformer.train.model = @ScalingTransformerLM
ScalingTransformerLM.vocab_size = {V}
ScalingTransformerLM.d_model = {D}
ScalingTransformerLM.d_ff = {D_FF}
ScalingTransformerLM.n_layers = 2
ScalingTransformerLM.n_heads = {HEADS}
ScalingTransformerLM.dropout = 0.0
ScalingTransformerLM.max_len = {MAX_LEN}
ScalingTransformerLM.d_lowrank = {LOWRANK}
"""
SPARSE_GIN = f"""
ScalingTransformerLM.ff_sparsity = {N}
ScalingTransformerLM.attention_sparsity = {S}
ScalingTransformerLM.loss_sparsity = {S_LOSS}
"""
