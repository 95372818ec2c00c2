"""Scaling Transformers and the Terraformer as Trax 1.4.1 combinators."""
import importlib.abc
import sys

from terraformer import runtime as _runtime

_runtime.install()  # Quiet imports of Trax/TF/Gym; Trax's fixes on its import.

# Modules of the flat layout before issue 24, and where each went. An old
# import (e.g. `import terraformer.ood` in a gin file) fails with one line
# naming the new path.
MOVED = {
    'compat': 'trax_bridge.compat',
    'trax_import': 'trax_bridge.checkpoint_import',
    'checkpoints': 'checkpoint.store',
    'sharded_training': 'training.fsdp',
    'finetune': 'training.finetune',
    'soak': 'training.soak',
    'decode_step': 'decoding.step',
    'ood': 'evaluation.ood',
    'export': 'evaluation.export',
    'decode_speed': 'benchmarks.decode_speed',
    'benchmark': 'benchmarks.decode_configs',
    'long_input_benchmark': 'benchmarks.long_input',
    'topk_benchmark': 'benchmarks.topk',
    'param_count': 'benchmarks.param_count',
    'kernels.bench': 'benchmarks.kernels',
}


class _MovedFinder(importlib.abc.MetaPathFinder):
  """Refuses the old flat module paths with the new one in the message."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    name = fullname[len(__name__) + 1:]
    if fullname.startswith(__name__ + '.') and name in MOVED:
      raise ModuleNotFoundError(
          f'{fullname} moved to {__name__}.{MOVED[name]}', name=fullname)
    return None


sys.meta_path.insert(0, _MovedFinder())
