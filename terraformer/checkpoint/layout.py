"""What a training checkpoint holds, by name: one layout for both trainers.

Trax's Loop (`terraformer/training/loop.py`, replicated weights) and the FSDP
loop (`terraformer/training/fsdp.py`, sharded weights) write the same files,
so that a run can switch `weight_sharding` and resume:

- `checkpoints/<step>/arrays` (`store.CheckpointStore`): every leaf of each
  tree of the training state, in `jax.tree_util` flattening order, named
  `<part>_<j:05d>` (`weights_00000`, ..., `state_*`, `eval_state_*`,
  `slots<i>_*` for the optimizer slots of task i), and `rng`;
- `<basename>.pkl.gz`: the dict of Trax 1.4.1's `Loop.save_checkpoint`
  (trax/supervised/training.py), its keys in Trax's order, with the
  `version_timestamp` Trax 1.4.1 writes, so that Trax's Loop reads it
  (`format.write_trax_checkpoint`).
"""
import os

import jax

from terraformer import errors
from terraformer.checkpoint import format as checkpoint_format
from terraformer.checkpoint import store

RNG = 'rng'
# Trax 1.4.1's `Loop.save_checkpoint` marks its dicts with this date.
TRAX_VERSION_TIMESTAMP = 'Mar-10-2021'


def array_name(part, index):
  """The name of leaf `index` of tree `part` among a checkpoint's arrays."""
  return f'{part}_{index:05d}'


def arrays_of(trees, rng, convert=lambda x: x):
  """name -> `convert(leaf)` of every leaf of `trees` (part -> tree), and
  `rng` under `RNG`."""
  arrays = {array_name(part, j): convert(leaf)
            for part, tree in trees.items()
            for j, leaf in enumerate(jax.tree_util.tree_leaves(tree))}
  arrays[RNG] = convert(rng)
  return arrays


def trees_of(arrays, templates):
  """part -> tree: the inverse of `arrays_of`, each part in the structure of
  `templates[part]`."""
  trees = {}
  for part, template in templates.items():
    structure = jax.tree_util.tree_structure(template)
    trees[part] = jax.tree_util.tree_unflatten(structure, [
        arrays[array_name(part, j)] for j in range(structure.num_leaves)])
  return trees


def trax_checkpoint(step, flat_weights, flat_state, flat_eval_state, history,
                    slots_per_task, input_signature):
  """The dict of Trax's `Loop.save_checkpoint` with its weights inline.

  `history` is `History.to_dict()`; `slots_per_task` a list of flat slots
  per task (empty where the slots are not in this file).
  """
  return {'step': step, 'flat_weights': flat_weights,
          'flat_state': flat_state, 'flat_eval_state': flat_eval_state,
          'history': history, 'slots_per_task': slots_per_task,
          'input_signature': input_signature,
          'version_timestamp': TRAX_VERSION_TIMESTAMP}


def write_trax_checkpoint(output_dir, basename, checkpoint):
  """Writes `checkpoint` (`trax_checkpoint`) as `<basename>.pkl.gz` in
  `output_dir`, atomically; a failure is one TerraformerError line (the
  partial file is gone, the previous file kept)."""
  name = basename + checkpoint_format.PKL
  try:
    checkpoint_format.write_trax_checkpoint(os.path.join(output_dir, name),
                                            checkpoint)
  except OSError as e:
    raise errors.TerraformerError(
        f'cannot write {name} in {output_dir} ('
        f'{"disk full" if store.is_disk_full(e) else e}); partial file '
        'removed, the previous one kept') from None
