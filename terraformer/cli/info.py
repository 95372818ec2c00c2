"""terraformer-info: parameter count of a gin-configured model, by layer kind.

  terraformer-info --config_file=F [--config='BINDING'] [--json]

Counts the model bound to `terraformer.train.model` (or
`count_parameters.model`) from weight shapes only, without allocating them.
"""
import json
import sys

from absl import flags

from terraformer.cli import common

PROG = 'terraformer-info'


def _define_flags(flag_values):
  flags.DEFINE_bool('json', False, 'Print JSON instead of a table.',
                    flag_values=flag_values)


def format_table(count):
  """Human-readable table of a ParamCount."""
  width = max([len('layer kind'), len('total')] + [len(k) for k in
                                                   count.by_layer])
  rows = [f'{"layer kind":<{width}}  {"parameters":>15}  {"share":>6}']
  for kind, n in list(count.by_layer.items()) + [('total', count.total)]:
    share = 100.0 * n / count.total if count.total else 0.0
    rows.append(f'{kind:<{width}}  {n:>15,}  {share:>5.1f}%')
  return '\n'.join(rows)


def _info(flag_values):
  from terraformer import param_count  # pylint: disable=g-import-not-at-top
  count = param_count.count_parameters()
  if flag_values.json:
    print(json.dumps({'by_layer': count.by_layer, 'total': count.total},
                     indent=2))
  else:
    print(format_table(count))
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _info)


if __name__ == '__main__':
  sys.exit(main())
