"""Text examples from a prepared TensorFlow Datasets (TFDS) dataset.

Datasets are read from `data_dir` and never downloaded unless asked
(`download=True`): C4 alone is hundreds of GB. A dataset that is not prepared
there is a TerraformerError that names the `tfds build` command.
"""
from terraformer.errors import TerraformerError

# How to prepare each dataset we use (shown when it is missing).
_PREPARE_HINTS = {
    'c4': ('C4 is built from Common Crawl with Apache Beam (see '
           'https://www.tensorflow.org/datasets/catalog/c4); or copy a '
           'prepared c4/en/<version> folder into data_dir'),
    'scientific_papers': ('downloads the arXiv/PubMed archives of Cohan et '
                          'al. (about 4.5 GB)'),
}


def dataset_name(dataset, version=None):
  """'c4/en' + '3.1.0' -> 'c4/en:3.1.0' (a version in `dataset` is kept)."""
  if version and ':' not in dataset:
    return f'{dataset}:{version}'
  return dataset


def _not_prepared_message(name, data_dir, error):
  base = name.split('/')[0].split(':')[0]
  hint = _PREPARE_HINTS.get(base)
  data_dir_text = data_dir or '~/tensorflow_datasets (the TFDS default)'
  message = (f'TFDS dataset {name!r} is not prepared in {data_dir_text}; '
             f'prepare it first: tfds build {name.split(":")[0]} '
             f'--data_dir={data_dir or "~/tensorflow_datasets"}')
  if hint:
    message += f' ({hint})'
  return f'{message}. TFDS said: {str(error).splitlines()[0]}'


def load(dataset, split, data_dir=None, version=None, shuffle_files=False,
         seed=0, download=False, per_process=False):
  """Returns the `tf.data.Dataset` of one split, with clear errors.

  Args:
    dataset: TFDS name, e.g. 'c4/en' or 'scientific_papers/arxiv'.
    split: TFDS split, e.g. 'train', 'validation', 'test[:100]'.
    data_dir: folder with prepared TFDS datasets; None: TFDS's default.
    version: dataset version, e.g. '3.1.0'; None: TFDS's default.
    shuffle_files: read the files of the split in a seeded random order
      (reshuffled every pass).
    seed: seed of the file order.
    download: let TFDS download and prepare a missing dataset.
    per_process: in a multi-process job, only this process's part of the
      split (`tfds.split_for_jax_process`: disjoint, equal parts, the
      remainder dropped).
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name = dataset_name(dataset, version)
  if per_process:
    import jax  # pylint: disable=g-import-not-at-top
    if jax.process_count() > 1:
      split = tfds.split_for_jax_process(split, drop_remainder=True)
  read_config = tfds.ReadConfig(shuffle_seed=seed)
  try:
    return tfds.load(name, split=split, data_dir=data_dir,
                     shuffle_files=shuffle_files, download=download,
                     read_config=read_config)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise TerraformerError(
        f'Unknown TFDS dataset {name!r}: {str(e).splitlines()[0]}') from None
  except AssertionError as e:
    if 'could not find data' in str(e):
      raise TerraformerError(_not_prepared_message(name, data_dir, e)) from None
    raise TerraformerError(
        f'Cannot load TFDS dataset {name!r}: {str(e).splitlines()[0]}'
    ) from None
  except ValueError as e:  # E.g. an unknown split.
    raise TerraformerError(
        f'Cannot load split {split!r} of TFDS dataset {name!r}: '
        f'{str(e).splitlines()[0]}') from None


def _text(value):
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def iterate_texts(ds, keys):
  """Yields, for each example of `ds`, the tuple of its `keys` as str."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  checked = False
  for example in tfds.as_numpy(ds):
    if not checked:
      missing = [k for k in keys if k not in example]
      if missing:
        raise TerraformerError(
            f'TFDS examples have no feature(s) {missing}; they have '
            f'{sorted(example)}')
      checked = True
    yield tuple(_text(example[k]) for k in keys)


def texts(dataset, split, keys, data_dir=None, version=None, shuffle_files=False,
          seed=0, download=False, per_process=False):
  """Returns a function: () -> iterator of str tuples, one pass of the split.

  The dataset is opened (and checked) when `texts` is called; each call of the
  returned function makes a new pass (with `shuffle_files`, in a new file
  order). `per_process`: as for `load`.
  """
  ds = load(dataset, split, data_dir, version, shuffle_files, seed, download,
            per_process)
  return lambda: iterate_texts(ds, keys)
