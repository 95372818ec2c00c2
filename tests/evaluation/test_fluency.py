"""Fluency figures on hand-made texts whose shares are counted by hand."""
import pytest

from terraformer.evaluation import fluency

TRAIN = ['The cat sat on the mat.', "Results don't hold for state-of-the-art models."]


def test_words_keep_inner_apostrophes_and_hyphens():
  assert fluency.words("Don't use state-of-the-art, 3 times!") == [
      "don't", 'use', 'state-of-the-art', '3', 'times']


def test_salad_of_known_words_passes_words_and_fails_trigrams():
  # Every word is in the training text; none of its 4 trigrams is.
  got = fluency.TrainingText(TRAIN).fluency(['the the cat on mat sat'])
  assert (got.words, got.trigrams) == (6, 4)
  assert got.known_words == 1.0
  assert got.known_trigrams == 0.0
  assert got.repeated_trigrams == 0.0


def test_copied_text_passes_both():
  got = fluency.TrainingText(TRAIN).fluency(['the cat sat on'])
  assert (got.known_words, got.known_trigrams) == (1.0, 1.0)


def test_shares_are_pooled_over_texts():
  # 'the dog sat on': 3 of 4 words known ('dog' is not), 0 of 2 trigrams;
  # 'on the mat': 3 of 3 words, 1 of 1 trigram. Pooled: 6/7 and 1/3.
  got = fluency.TrainingText(TRAIN).fluency(['the dog sat on', 'on the mat'])
  assert (got.words, got.trigrams) == (7, 3)
  assert got.known_words == pytest.approx(6 / 7)
  assert got.known_trigrams == pytest.approx(1 / 3)


def test_repeated_trigrams_count_repeats_within_a_text_only():
  # a b c a b c: trigrams abc, bca, cab, abc -> 1 repeat of 4; the second
  # text repeats the first one's trigram, which does not count.
  got = fluency.TrainingText([]).fluency(['a b c a b c', 'a b c'])
  assert got.trigrams == 5
  assert got.repeated_trigrams == pytest.approx(1 / 5)
  assert got.known_words == 0.0


def test_no_words_gives_none_not_zero():
  got = fluency.TrainingText(TRAIN).fluency(['', '...', 'two words'])
  assert got.known_trigrams is None and got.repeated_trigrams is None
  assert got.known_words == 0.0
