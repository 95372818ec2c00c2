"""Text <-> tokens as the training data made them, for a trained model.

`text_vocab` (gin: `terraformer.text_vocab`, bound to the gin files'
`VOCAB_SIZE`/`VOCAB_PATH` macros) is the SentencePiece vocab of a config;
`training_lengths` the input and target lengths its data streams were bound
to; `encode_input` and `detokenize` tokenize an encoder input and read
decoded ids back as the streams do. terraformer-decode, terraformer-eval and
the evaluation harnesses use them.
"""
import gin

from terraformer.data import vocab as vocab_lib


@gin.configurable(module='terraformer')
def text_vocab(vocab_size=gin.REQUIRED, vocab_path=None, papers_dir=None):
  """The SentencePiece vocab of a gin config (`terraformer.get_vocab`).

  Gin files bind `text_vocab.vocab_size = %VOCAB_SIZE` (and `vocab_path =
  %VOCAB_PATH` where the config has a user vocab), so decoding and
  evaluation tokenize as the data pipeline did.
  """
  return vocab_lib.get_vocab(vocab_size, vocab_path, papers_dir)


def gin_binding(*names, scopes=('', 'train/')):
  """The first gin binding among `names` (e.g. 'seq2seq_stream.input_len'),
  each looked up in `scopes` in order; a macro's value; None if unbound."""
  for name in names:
    for scope in scopes:
      try:
        value = gin.query_parameter(scope + name)
      except ValueError:
        continue
      # A macro (`input_len = %INPUT_LEN`) is a reference: its value.
      while (isinstance(value, gin.config.ConfigurableReference)
             and value.evaluate):
        value = value.scoped_configurable_fn()
      return value
  return None


def training_lengths():
  """(input_len, target_len) of the gin-bound seq2seq data (or None)."""
  streams = ('summarization_stream', 'seq2seq_stream', 'c4_stream')
  return (gin_binding(*(f'{s}.input_len' for s in streams)),
          gin_binding(*(f'{s}.target_len' for s in streams)))


def encode_input(vocab, text, input_len):
  """Tokens of an encoder input as in training: ids + EOS, cut to input_len.

  Returns (tokens, number of tokens cut off).
  """
  ids = list(vocab.encode(text)) + [vocab.eos_id]
  return ids[:input_len], max(0, len(ids) - input_len)


def detokenize(vocab, ids):
  """Text of decoded ids; ids past the text vocab (e.g. the sentinels of
  the masked-word objective, appended after it) are dropped."""
  return vocab.decode([i for i in ids if 0 <= i < vocab.vocab_size])
