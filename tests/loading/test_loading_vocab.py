"""The config's vocabulary and training lengths; text <-> tokens as in
training."""
import gin

# Registers `summarization_stream`, whose lengths the tests bind.
from terraformer.data import summarization  # pylint: disable=unused-import
from terraformer.loading import vocab as loading_vocab


class _FakeVocab:
  vocab_size = 10
  eos_id = 1

  def encode(self, text):
    return [int(t) for t in text.split()]

  def decode(self, ids):
    return ' '.join(str(i) for i in ids)


def test_encode_input_appends_eos_then_truncates():
  vocab = _FakeVocab()
  assert loading_vocab.encode_input(vocab, '5 6 7', 8) == ([5, 6, 7, 1], 0)
  assert loading_vocab.encode_input(vocab, '5 6 7', 4) == ([5, 6, 7, 1], 0)
  # As the training streams do: (ids + EOS)[:input_len].
  assert loading_vocab.encode_input(vocab, '5 6 7 8 9', 3) == ([5, 6, 7], 3)


def test_detokenize_drops_ids_past_the_vocab():
  assert loading_vocab.detokenize(_FakeVocab(), [3, 12, 9, 10]) == '3 9'


def test_training_lengths_resolve_macros():
  """`summarization_stream.input_len = %INPUT_LEN` (gin/main/finetune.gin)
  gives the macro's value, through nested macros too."""
  try:
    gin.parse_config("""
        INPUT_LEN = 512
        LEN = %INPUT_LEN
        summarization_stream.input_len = %LEN
        train/summarization_stream.target_len = 96
    """)
    assert loading_vocab.training_lengths() == (512, 96)
  finally:
    gin.clear_config()


def test_text_vocab_is_the_vocab_the_gin_files_bind(monkeypatch):
  """Gin files bind `text_vocab.vocab_size` (and `vocab_path`): the name is
  `terraformer.text_vocab` wherever the function lives."""
  monkeypatch.setattr(loading_vocab.vocab_lib, 'get_vocab',
                      lambda *args: args)
  try:
    gin.parse_config('text_vocab.vocab_size = 123\n'
                     'terraformer.text_vocab.vocab_path = "/my/spm.model"')
    assert loading_vocab.text_vocab() == (123, '/my/spm.model', None)
  finally:
    gin.clear_config()
