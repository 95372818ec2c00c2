"""Offline data: aclsum papers, a SentencePiece vocab, Trax input streams."""
from terraformer.data.aclsum_papers import load_papers
from terraformer.data.aclsum_papers import load_split
from terraformer.data.aclsum_papers import split_of
from terraformer.data.aclsum_papers import SPLITS
from terraformer.data.streams import lm_stream
from terraformer.data.streams import seq2seq_stream
from terraformer.data.vocab import get_vocab
from terraformer.data.vocab import Vocab
from terraformer.data.arithmetic import arithmetic_stream
from terraformer.data.c4 import c4_lm_stream
from terraformer.data.c4 import c4_prefix_lm_stream
from terraformer.data.c4 import c4_stream
from terraformer.data.summarization import summarization_pairs
from terraformer.data.summarization import summarization_stream
from terraformer.data.long_range_recall import long_range_recall_lm_stream
from terraformer.data.long_range_recall import long_range_recall_stream
from terraformer.data.salient_extraction import salient_extraction_stream
