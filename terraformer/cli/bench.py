"""terraformer-bench: unbatched decoding speed of gin-configured models.

  terraformer-bench --config_file=F [--config_file=G ...] [--config=BINDING]
      [--tokens=N] [--prompt_len=L] [--repeats=R] [--json=PATH]
      [--compare_trax] [--project_layers=L [--fit_blocks=B]]
  terraformer-bench --trax_user_path --config_file=F [...] [--tokens=N]
  terraformer-bench --xla_ops --config_file=F [...]
  terraformer-bench --agreement --config_file=F --config_file=G [...]
      [--checkpoint=CKPT_DIR] [--prompt_file=TEXT] [--variants=V,...]
  terraformer-bench --quality --config_file=F [...] --checkpoint=CKPT_DIR
      [--variants=V,...] [--split=test] [--max_examples=N]
  terraformer-bench --profile_dir=DIR --config_file=F [...] [--tokens=N]
  terraformer-bench --sweep [--config_file=DENSE --config_file=SPARSE]
      [--sweep_d_models=512,1024,2048,4096] [--plot=PATH] [--json=PATH]

Unlike terraformer-train, where several --config_file compose one model,
here EACH --config_file is one model: several files are several models,
timed in one run and compared side by side (the first is the baseline of the
speedup columns). Join files with '+' to compose them into one model
(--config_file=a.gin+b.gin). --config bindings apply to every model.
--variants=KERNELS[:WEIGHTS],... decodes each config as it is and with each
of those decode options (`decode_options.kernels` and `.weights`), e.g.
--variants=ffi,ffi:bfloat16,ffi:int8,ffi:q8: model CONFIG+ffi_int8, ...

Every model gets random weights (speed does not depend on them) and decodes
--tokens tokens greedily, batch 1, after a --prompt_len-token prompt (the
encoder input of an encoder-decoder, fed token by token to an LM). The table
shows ms/token (median and range over --repeats), ms per decoder block, the
bytes of weights and caches a step reads, the compute bound (compute ms: the
step's int8 and float multiply-adds at the peak rates of the kernels' int8
instruction and float32 FMA, probed between rounds), the bound (the larger
of those bytes at the GEMV bandwidth measured in the same run and the
compute bound), and speedups: over the first
model, over the dense model of the same decode options (kernels, weight
storage) and d_model in the run, both measured (vs dense), and over that
dense model at its bound (vs dense bound: the speedup over a dense model
that decoded at memory speed). Every table ends with the machine: the CPU
model and the paths the kernels take (float kernels' and Q8 GEMV's
instruction sets; the JSON's `machine`). --compare_trax also
times Trax 1.4.1's reference model with the same settings. --sweep scales
the models over d_model and plots the speedup of each over the first.
--project_layers=L times models too large to hold (the 17B ones) with
--fit_blocks decoder blocks and no encoder blocks, and projects ms/token and
bytes to L decoder blocks, beside the paper's seconds (the config's
PAPER_DECODE_SECONDS). --trax_user_path times whole decode calls instead:
terraformer.decoding.search.decode next to Trax's own autoregressive_sample.
--xla_ops counts the XLA operations per decoder block of each model's step.
--agreement compares each model's logits with the first's (the same
weights, each model fed the first's greedy tokens: teacher-forced): max
|delta logit|, greedy agreement (the share of positions with the first's
argmax) and the first position that differs (where a free-running greedy
decode would depart), e.g. of the fused kernels (--variants or
gin/bench/800m_*_kernels*.gin, `decode_options`) with bf16/int8/q8 weights
against XLA float32. The weights are random, or with --checkpoint=CKPT_DIR
those of a checkpoint terraformer-train wrote for the same config (loaded
as terraformer-decode loads it); --prompt_file makes the prompt real text.
--quality teacher-forces each model on the reference targets of a split's
summarization pairs (article -> abstract, tokenized and cut as the
config's summarization stream makes them; `summarization_pairs`' gin
bindings choose the source) and reports what 8-bit CPU runtimes report of a
quantized model: each model's log-perplexity of those targets (the eval's
loss, nats per token) and, against the first model, the mean KL divergence
of the next-token distributions and the share of positions with its top
token (over every target position, not one greedy decode).
The gin binding bench_weights.noise = R adds noise of R x each array's RMS
to the weights: a model known to differ, to calibrate the check.
The gin binding bench_weights.created = 'stored' makes each model's kernel
layer matrices directly in their decode storage (int8 + row scales), never a
float32 copy: the 17B int8 configs (gin/bench/*17b*_kernels_int8.gin) fit in
memory that way; the run then prints the memory each model held (weights by
layer kind, caches) and the peak RSS (not with --agreement, which needs the
same float32 weights for every model).
--profile_dir=DIR writes a jax.profiler trace of --tokens decoding steps of
each model (after an untimed warm-up, so no compilation in it) under DIR,
one run folder per model (view with TensorBoard's profile plugin, or open
the .xplane.pb in XProf), and prints where a step's time goes: its XLA
operations' self time per step by kind (ffi_call = the fused kernels) and
the slowest ones with their compiled HLO line (benchmarks/step_profile.py);
nothing is timed otherwise; its table lists --profile_operations operations
per model. The benchmarks return numbers; the tables and the plot are made
by terraformer/cli/bench_format.py. --json writes the report (a list of
models becomes {"models": [...]}) with the machine and, under "tables", the
tables printed (speed and memory, projection, agreement, quality, xla_ops,
user_path, profile or sweep: {"columns", "rows"}).
"""
import json
import os
import sys

from absl import flags

from terraformer import config
from terraformer import errors
from terraformer.cli import bench_format
from terraformer.cli import common

PROG = 'terraformer-bench'
_GIN_DIR = config.GIN_DIR
DEFAULT_SWEEP_CONFIGS = ('bench/sweep_dense.gin', 'bench/sweep_sparse.gin')


def _define_flags(flag_values):
  flags.DEFINE_integer('tokens', 32, 'Tokens decoded (timed) per repeat.',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_integer('prompt_len', 16, 'Prompt length.', lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer('repeats', 5, 'Timed repeats (after one warm-up).',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_integer('seed', 0, 'Seed of the random weights and prompt.',
                       flag_values=flag_values)
  flags.DEFINE_string('json', None, 'Also write the results to this JSON file.',
                      flag_values=flag_values)
  flags.DEFINE_bool('compare_trax', False,
                    "Also time Trax 1.4.1's reference model of each config.",
                    flag_values=flag_values)
  flags.DEFINE_bool('sweep', False,
                    'Sweep d_model; plot the speedup over the first config.',
                    flag_values=flag_values)
  flags.DEFINE_list('sweep_d_models', '512,1024,2048,4096',
                    'd_model values of --sweep.', flag_values=flag_values)
  flags.DEFINE_float('memory_budget_gb', None,
                     'Models held (and timed interleaved) at once; default '
                     '40% of the available memory.', lower_bound=0.1,
                     flag_values=flag_values)
  flags.DEFINE_bool('agreement', False,
                    'Compare each model\'s logits with the first model\'s '
                    '(same random weights): max |delta logit| and greedy '
                    'agreement over --tokens tokens.',
                    flag_values=flag_values)
  flags.DEFINE_bool('quality', False,
                    "Each model's teacher-forced log-perplexity of the "
                    "reference targets of --split's summarization pairs, and "
                    "the first model's mean KL divergence to it and share of "
                    'the same top token.', flag_values=flag_values)
  flags.DEFINE_string('split', 'test',
                      'With --quality: the split of the pairs.',
                      flag_values=flag_values)
  flags.DEFINE_integer('max_examples', None,
                       'With --quality: the first this many pairs (default: '
                       'all).', lower_bound=1, flag_values=flag_values)
  flags.DEFINE_string('checkpoint', None,
                      'With --agreement or --quality: every model decodes the weights of '
                      'this checkpoint (an --output_dir of terraformer-train '
                      'of the same model config) instead of random ones.',
                      flag_values=flag_values)
  flags.DEFINE_string('prompt_file', None,
                      'With --agreement: the prompt (encoder input) is the '
                      "text of this file, tokenized with the config's "
                      'vocab, instead of random tokens.',
                      flag_values=flag_values)
  flags.DEFINE_list('variants', None,
                    'Decode each --config_file as it is and with each of '
                    'these decode options, KERNELS[:WEIGHTS] (e.g. '
                    'xla,ffi,ffi:bfloat16,ffi:int8,ffi:q8): one model each, '
                    'named CONFIG+KERNELS_WEIGHTS.',
                    flag_values=flag_values)
  flags.DEFINE_bool('xla_ops', False,
                    'Count the XLA operations per decoder block of each '
                    'model (compiled from shapes; nothing is timed).',
                    flag_values=flag_values)
  flags.DEFINE_bool('trax_user_path', False,
                    'Time whole greedy decode calls of each model: '
                    "terraformer.decoding.search.decode and Trax's "
                    'autoregressive_sample.', flag_values=flag_values)
  flags.DEFINE_integer('project_layers', None,
                       'Models too large to hold: time each with '
                       '--fit_blocks decoder blocks (no encoder blocks) and '
                       'project ms/token to this many decoder blocks.',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_integer('fit_blocks', 1,
                       'Decoder blocks timed with --project_layers.',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_string('profile_dir', None,
                      'Write a jax.profiler trace of --tokens decoding steps '
                      'of each model to this folder (nothing is timed).',
                      flag_values=flag_values)
  flags.DEFINE_integer('profile_operations', 6,
                       'With --profile_dir: the operations listed per model '
                       'in the table (the costliest; the others summed).',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_string('plot', 'terraformer_bench_sweep.png',
                      'PNG written by --sweep.', flag_values=flag_values)


def split_config_files(argv):
  """(argv without --config_file flags, [[files of model 1], ...]).

  Each --config_file value is one model; 'a.gin+b.gin' composes two files.
  """
  rest, models, i = [], [], 0
  while i < len(argv):
    arg = argv[i]
    value = None
    if arg.startswith('--config_file='):
      value = arg[len('--config_file='):]
    elif arg == '--config_file' and i + 1 < len(argv):
      value = argv[i + 1]
      i += 1
    else:
      rest.append(arg)
    if value is not None:
      models.append([f for f in value.split('+') if f])
      if not models[-1]:
        raise errors.TerraformerError('empty --config_file')
    i += 1
  return rest, models


def model_name(files, taken):
  """Label of a model: its file names without .gin, joined by '+'."""
  base = '+'.join(os.path.splitext(os.path.basename(f))[0] for f in files)
  name, n = base, 2
  while name in taken:
    name, n = f'{base}#{n}', n + 1
  taken.add(name)
  return name


# A variant's gin bindings ride in its config list after its files (parse
# tells them apart by the ' = ').
_BINDING = ' = '


def variant_bindings(variant):
  """(name suffix, gin bindings) of a --variants entry KERNELS[:WEIGHTS]."""
  from terraformer.decoding import step as decode_step  # pylint: disable=g-import-not-at-top
  from terraformer.kernels import layers as kernel_layers  # pylint: disable=g-import-not-at-top
  kernels, _, weights = variant.partition(':')
  weights = weights or 'float32'
  if (kernels not in decode_step.KERNEL_MODES or
      weights not in kernel_layers.STORAGES):
    raise errors.TerraformerError(
        f'--variants: {variant!r} is not KERNELS[:WEIGHTS] with KERNELS in '
        f'{decode_step.KERNEL_MODES} and WEIGHTS in {kernel_layers.STORAGES}')
  suffix = kernels if weights == 'float32' else f'{kernels}_{weights}'
  return suffix, [f"decode_options.kernels{_BINDING}'{kernels}'",
                  f"decode_options.weights{_BINDING}'{weights}'"]


def expand_variants(configs, variants):
  """[(name, config)] with each config followed by one model per variant
  (`variant_bindings` appended to its config list)."""
  if not variants:
    return configs
  pairs = [variant_bindings(v) for v in variants]
  return [(f'{name}+{suffix}', list(files) + bindings)
          for name, files in configs for suffix, bindings in pairs]


def _check_writable_folder(path, flag):
  """The folder `path` exists and is writable, or can be made in one."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise errors.TerraformerError(f'--{flag}={path} is not a folder')
  existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.access(existing, os.W_OK):
    raise errors.TerraformerError(
        f'--{flag}={path}: folder {existing!r} is not writable')


def _budget(flag_values):
  gb = flag_values.memory_budget_gb
  return None if gb is None else gb * 1e9


def _log(message):
  print(message, file=sys.stderr, flush=True)


def _check_reference(configs, mode):
  if len(configs) < 2:
    raise errors.TerraformerError(
        f'--{mode} needs two or more models (the first is the reference)')


def _bench(flag_values, model_files):
  from terraformer.benchmarks import decode_configs as benchmark  # pylint: disable=g-import-not-at-top
  from terraformer.benchmarks import decode_speed  # pylint: disable=g-import-not-at-top
  bindings = list(flag_values.config or [])

  def parse(model, extra):
    files = [f for f in model if _BINDING not in f]
    config.parse_gin(files, bindings + [f for f in model if _BINDING in f]
                     + list(extra))

  taken = set()
  configs = [(model_name(files, taken), files) for files in model_files]
  configs = expand_variants(configs, flag_values.variants)
  if flag_values.prompt_file and not flag_values.agreement:
    raise errors.TerraformerError(
        '--prompt_file goes with --agreement (--quality decodes the '
        "split's inputs; speed does not depend on the prompt)")
  if (flag_values.checkpoint and
      not (flag_values.agreement or flag_values.quality)):
    raise errors.TerraformerError(
        '--checkpoint goes with --agreement or --quality (speed does not '
        'depend on the weights)')
  if flag_values.sweep:
    try:
      d_models = [int(d) for d in flag_values.sweep_d_models]
    except ValueError:
      raise errors.TerraformerError(
          f'--sweep_d_models: not integers: {flag_values.sweep_d_models}'
      ) from None
    if not configs:
      configs = [(model_name([f], taken), [os.path.join(_GIN_DIR, f)])
                 for f in DEFAULT_SWEEP_CONFIGS]
    if len(configs) < 2:
      raise errors.TerraformerError(
          '--sweep needs two or more models (the first is the baseline)')
    names = [name for name, _ in configs]
    report = benchmark.sweep(
        configs, parse, d_models, flag_values.tokens, flag_values.prompt_len,
        flag_values.repeats, flag_values.seed, _budget(flag_values), log=_log,
        on_row=lambda row: _log(bench_format.format_sweep(
            {'rows': [row], 'names': names})))
    tables = {'sweep': bench_format.sweep_table(report)}
    print(common.format_aligned(tables['sweep']))
    bench_format.plot_sweep(report, flag_values.plot)
    print(f'plot: {flag_values.plot}')
  elif flag_values.profile_dir:
    if not configs:
      raise errors.TerraformerError('at least one --config_file is required')
    report = benchmark.profile(configs, parse, flag_values.profile_dir,
                               flag_values.tokens, flag_values.prompt_len,
                               flag_values.seed, log=_log)
    for r in report:
      print(f"{r['name']:<28} trace of {r['tokens']} steps: {r['trace_dir']}")
      print(bench_format.format_profile(r['name'], r['summary']))
    tables = {'profile': bench_format.profile_table(
        report, flag_values.profile_operations)}
    print(common.format_aligned(tables['profile']))
  elif flag_values.agreement:
    _check_reference(configs, 'agreement')
    report = benchmark.agreement(configs, parse, flag_values.tokens,
                                 flag_values.prompt_len, flag_values.seed,
                                 log=_log, checkpoint=flag_values.checkpoint,
                                 prompt_file=flag_values.prompt_file)
    tables = {'agreement': bench_format.agreement_table(report)}
    print(bench_format.format_agreement(report))
  elif flag_values.quality:
    _check_reference(configs, 'quality')
    report = benchmark.quality(configs, parse, flag_values.split,
                               flag_values.max_examples, flag_values.seed,
                               log=_log, checkpoint=flag_values.checkpoint)
    tables = {'quality': bench_format.quality_table(report)}
    print(bench_format.format_quality(report))
  elif flag_values.xla_ops:
    if not configs:
      raise errors.TerraformerError('at least one --config_file is required')
    report = benchmark.xla_ops(configs, parse,
                               prompt_len=flag_values.prompt_len, log=_log)
    tables = {'xla_ops': bench_format.xla_ops_table(report)}
    print(bench_format.format_xla_ops(report))
  elif flag_values.trax_user_path:
    if not configs:
      raise errors.TerraformerError('at least one --config_file is required')
    report = benchmark.user_path(configs, parse, flag_values.tokens,
                                 flag_values.prompt_len, flag_values.repeats,
                                 flag_values.seed, log=_log)
    tables = {'user_path': bench_format.user_path_table(report)}
    print(bench_format.format_user_path(report))
  else:
    if not configs:
      raise errors.TerraformerError('at least one --config_file is required')
    report = benchmark.run(configs, parse, flag_values.tokens,
                           flag_values.prompt_len, flag_values.repeats,
                           flag_values.seed, flag_values.compare_trax,
                           _budget(flag_values), log=_log,
                           project_layers=flag_values.project_layers,
                           fit_blocks=flag_values.fit_blocks)
    if flag_values.project_layers is None:
      tables = {'speed': bench_format.speed_table(report)}
      print(bench_format.format_table(report))
    else:
      tables = {'projection': bench_format.projection_table(report)}
      print(bench_format.format_projection(report))
    memory = bench_format.memory_table(report)
    if memory:
      tables['memory'] = memory
      print(common.format_aligned(memory))
    print(bench_format.format_memory_lines(report))
  machine = decode_speed.machine()
  print(bench_format.format_machine(machine))
  if flag_values.json:
    report = dict(report, machine=machine) if isinstance(report, dict) else {
        'models': report, 'machine': machine}
    with open(flag_values.json, 'w') as f:
      json.dump(bench_format.json_report(common.with_tables(report, tables)),
                f, indent=2)
  return 0


def main(argv=None):
  argv = sys.argv if argv is None else argv
  if any(a in ('-h', '--help', '-help', '--helpfull') for a in argv[1:]):
    print(__doc__)  # Says how --config_file differs from terraformer-train.
  try:
    argv, model_files = split_config_files(list(argv))
  except errors.TerraformerError as e:
    print(f'{PROG}: error: {e}', file=sys.stderr)
    return common.EXIT_USAGE

  def precheck(flag_values):
    config.check_config_files([f for files in model_files for f in files])
    common.check_writable_file(flag_values.json, 'json')
    if flag_values.profile_dir:
      _check_writable_folder(flag_values.profile_dir, 'profile_dir')
    if flag_values.sweep:
      common.check_writable_file(flag_values.plot, 'plot')

  return common.run(PROG, argv, _define_flags,
                    lambda fv: _bench(fv, model_files), precheck=precheck)


if __name__ == '__main__':
  sys.exit(main())
