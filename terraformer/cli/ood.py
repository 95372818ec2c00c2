"""terraformer-ood: Table 4, out-of-distribution copy and addition (§4.3).

  terraformer-ood --output_dir=DIR [--cells=copy_transformer,add_transformer]
      [--config_file=gin/ood/paper_scale.gin] [--config='BINDING']
      [--seeds=0,1] [--table_only]

Trains each cell (`gin/ood/<cell>.gin`: a task and a model) into
`DIR/<cell>` with `terraformer.train` (TensorBoard events there), decodes
numbers over twice as long as the training ones greedily, prints the table in
markdown and writes it to `DIR/ood_table.{json,md}`. With --seeds each cell
runs once per seed (in `DIR/<cell>_seed<k>`) and the table gives the mean
and the per-seed values. --table_only trains nothing and tabulates the
finished runs. --config_file and
--config apply to every cell, after its own file. Rerunning resumes
unfinished cells and skips finished ones (same gin config).
"""
import sys

from absl import flags

from terraformer import config
from terraformer.cli import common

PROG = 'terraformer-ood'


def _define_flags(flag_values):
  from terraformer.evaluation import ood  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string('output_dir', None,
                      'Directory: one subdirectory per cell, and the table.',
                      flag_values=flag_values)
  flags.DEFINE_list('cells', list(ood.DEFAULT_CELLS),
                    'Cells to run: names of gin/ood/<cell>.gin files, or '
                    'paths of gin files.', flag_values=flag_values)
  flags.DEFINE_list('seeds', None,
                    'Seeds, e.g. 0,1: each cell runs once per seed in '
                    'DIR/<cell>_seed<k> (terraformer.train.random_seed and '
                    'the training numbers), and the table pools them.',
                    flag_values=flag_values)
  flags.DEFINE_bool('table_only', False,
                    'Train nothing: print and write the table of the runs '
                    'that have finished (the others are named as missing).',
                    flag_values=flag_values)


def _precheck(flag_values):
  from terraformer.evaluation import ood  # pylint: disable=g-import-not-at-top
  common.check_output_dir(flag_values.output_dir)
  if not flag_values.cells:
    raise common.errors.TerraformerError('--cells is empty')
  for cell in flag_values.cells:
    ood.cell_config_file(cell, config.GIN_DIR)
  _seeds(flag_values)


def _seeds(flag_values):
  if flag_values.seeds is None:
    return None
  try:
    return [int(k) for k in flag_values.seeds]
  except ValueError:
    raise common.errors.TerraformerError(
        f'--seeds must be integers, got {",".join(flag_values.seeds)!r}'
    ) from None


def _run(flag_values):
  from terraformer.evaluation import ood  # pylint: disable=g-import-not-at-top
  output_dir = common.check_output_dir(flag_values.output_dir)
  _, table = ood.run_table(output_dir, flag_values.cells,
                           flag_values.config_file, flag_values.config,
                           seeds=_seeds(flag_values),
                           table_only=flag_values.table_only)
  print(table)
  print(f'Table written to {output_dir}/{ood.TABLE_JSON} and '
        f'{ood.TABLE_MD}')
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _run, precheck=_precheck)


if __name__ == '__main__':
  sys.exit(main())
