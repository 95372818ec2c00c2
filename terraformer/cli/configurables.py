"""The gin configurables that the files in gin/ bind, registered together.

A gin file binds names of every floor: the model and its layers, the data
streams, the trainer (`terraformer.train`, where the model itself is bound),
the vocabulary (`terraformer.text_vocab`), the evaluation
(`terraformer.evaluate`), the decode path's switches and the benchmark's
weights. One file serves several programs (a training config is also the
config of terraformer-decode, -eval and -info), so every program that reads
gin files registers all of them (`common.setup`) before parsing: a file
parses in each of them or in none. `terraformer.config` sits below these
floors and registers only Trax's.
"""
from terraformer import config


def register():
  """Imports each module whose `@gin.configurable`s the gin files bind."""
  config.register_configurables()  # Trax's first, as `trax/trainer.py`.
  # pylint: disable=g-import-not-at-top,unused-import,import-outside-toplevel
  from terraformer import layers
  from terraformer import models
  from terraformer import data  # The streams and their vocab.
  from terraformer.decoding import step  # decode_options.
  from terraformer.loading import vocab  # text_vocab.
  from terraformer.training import loop  # train: the model is bound there.
  from terraformer.evaluation import rouge  # evaluate, paper_pairs.
  from terraformer.benchmarks import param_count  # count_parameters.
  from terraformer.benchmarks import weight_factory  # bench_weights.
