"""Sparse layers of the Scaling Transformer, one file per mechanism."""
from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.sparse_ff import SparseFF
from terraformer.layers.sparse_logits import SparseLogits
from terraformer.layers.sparse_qkv_attention import ModuleConv
from terraformer.layers.sparse_qkv_attention import SparseQKV
from terraformer.layers.sparse_qkv_attention import SparseQKVAttention
from terraformer.layers.sparse_qkv_attention import SparseQKVCausalAttention
