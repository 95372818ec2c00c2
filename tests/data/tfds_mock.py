"""TFDS mocked with chosen texts: `tfds.testing.mock_data` with the real
feature spec of the dataset (c4, scientific_papers) and our examples."""
import contextlib

import tensorflow as tf
import tensorflow_datasets as tfds


@contextlib.contextmanager
def texts(examples_by_split):
  """Mocks every TFDS dataset; split -> list of {feature: str} examples.

  Features an example leaves out are empty strings; `as_dataset` of a split
  not in the dict fails like a missing split.
  """
  def as_dataset(self, split, **kwargs):
    del kwargs
    keys = list(self.info.features.keys())
    if hasattr(split, 'drop_remainder'):  # split_for_jax_process's part.
      examples = examples_by_split[split.split]
      assert split.drop_remainder
      n = len(examples) // split.count
      examples = examples[split.index * n:(split.index + 1) * n]
    else:
      examples = examples_by_split[str(split)]
    signature = {k: tf.TensorSpec((), tf.string) for k in keys}
    return tf.data.Dataset.from_generator(
        lambda: ({k: ex.get(k, '') for k in keys} for ex in examples),
        output_signature=signature)

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    yield
