"""Sparse layers of the Scaling Transformer, one file per mechanism."""
from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.sparse_ff import SparseFF
from terraformer.layers.sparse_logits import SparseLogits
from terraformer.layers.sparse_qkv_attention import ModuleConv
from terraformer.layers.sparse_qkv_attention import SparseQKV
from terraformer.layers.sparse_qkv_attention import SparseQKVAttention
from terraformer.layers.sparse_qkv_attention import SparseQKVCausalAttention
from terraformer.layers.low_rank_sru import LowRankSRU
from terraformer.layers.low_rank_sru import SRU
from terraformer.layers.lsh_attention import LSHCore
from terraformer.layers.lsh_attention import SelfAttention
from terraformer.layers.reversible import HalfResidual
from terraformer.layers.reversible import ReversibleSerial
