"""Fluency figures of generated text, measured against a training corpus.

ROUGE rewards frequent words, so a model that emits a salad of them ("the of
a in the to ...") scores ROUGE-1 near an extractive baseline. Three figures
tell text from salad, each pooled over all texts (micro average):

- known words: the share of generated words that occur in the training text.
  Salad of frequent words passes this one;
- known trigrams: the share of generated word trigrams that occur in the
  training text. Salad fails it: its word sequences are not English;
- repeated trigrams: the share of a text's trigrams that repeat an earlier
  trigram of the same text (the loops of a degenerate decoder).

The same figures of the reference summaries are the yardstick: references are
unseen text too, so their known-trigram share is what fluent text reaches.
"""
import dataclasses
import re

# Lower-cased words: letters and digits, with inner apostrophes and hyphens
# ("don't", "state-of-the-art" stay one word).
_WORD = re.compile(r"[a-z0-9]+(?:['\-][a-z0-9]+)*")


def words(text):
  """The lower-cased words of `text`, in order."""
  return _WORD.findall(text.lower())


def trigrams(word_list):
  """The word trigrams of `word_list`, in order (overlapping)."""
  return list(zip(word_list, word_list[1:], word_list[2:]))


@dataclasses.dataclass(frozen=True)
class Fluency:
  """Shares in [0, 1]; None where the texts hold no word (no trigram)."""
  known_words: float | None
  known_trigrams: float | None
  repeated_trigrams: float | None
  words: int
  trigrams: int


class TrainingText:
  """The words and word trigrams of a training corpus."""

  def __init__(self, texts):
    self.words = set()
    self.trigrams = set()
    for text in texts:
      text_words = words(text)
      self.words.update(text_words)
      self.trigrams.update(trigrams(text_words))

  def fluency(self, texts):
    """The `Fluency` of `texts` (an iterable of strings) against this text."""
    n_words = known_words = n_trigrams = known_trigrams = repeated = 0
    for text in texts:
      text_words = words(text)
      n_words += len(text_words)
      known_words += sum(w in self.words for w in text_words)
      seen = set()
      for trigram in trigrams(text_words):
        n_trigrams += 1
        known_trigrams += trigram in self.trigrams
        repeated += trigram in seen
        seen.add(trigram)
    share = lambda part, whole: part / whole if whole else None
    return Fluency(known_words=share(known_words, n_words),
                   known_trigrams=share(known_trigrams, n_trigrams),
                   repeated_trigrams=share(repeated, n_trigrams),
                   words=n_words, trigrams=n_trigrams)
