"""Test-wide setup.

pytest (prepend import mode) puts the folder of every conftest.py on sys.path,
so this file makes the helpers in tests/ (e.g. `import peak_rss`) importable
from the test files in its subfolders too.

For the whole session, this process and every process a test starts (they
inherit the environment):

- JAX's persistent compilation cache is .pytest_compilation_cache/ (shared by
  the xdist workers and kept between runs; TERRAFORMER_COMPILATION_CACHE, if
  set, names another directory or `off`): tests that compile the same tiny
  models load what another test compiled.
- Programs that take 20 ms or more to compile are written to that cache
  (TERRAFORMER_COMPILATION_CACHE_MIN_SECS; a user's default is 0.5 s):
  the ~50 ms programs of Trax's weight initialization, which every training
  process of the same tiny model compiles again otherwise. Reading them
  back is cheaper: a warm `terraformer-train` of the main job's tiny model
  took 17.6 s of CPU instead of 21.6 s, a cold one no longer.
- XLA compiles without its expensive optimisation passes
  (COMPILE_FLAGS): the suite's programs are tiny models run for a few steps,
  where compiling at the default level costs more than it saves (a resume
  test: 46 s at the default level, 27 s with the first two flags). XLA's
  CPU backend also emits its fusions with the older LLVM emitter instead of
  the MLIR fusion emitters, in one code-generation module instead of split
  ones: tests/layers/test_reversible.py and test_lsh_attention.py took 63
  CPU-s without these two, 35 s with them; tests/models/test_long_inputs.py
  115 s and 85 s. The programs compute the same functions; only fusion and
  code generation differ.
- XLA's CPU rendezvous waits longer: on a loaded machine (2 cores, load 5-7)
  the threads of 4 forced host devices reached an all-reduce more than 40 s
  apart, and XLA ended the process ("Termination timeout for `all reduce
  RendezvousKey{...}` of 40 seconds", rendezvous.cc). A real deadlock still
  ends: every test bounds its subprocesses' time.
"""
import collections
import json
import os
import resource

import pytest

import terraformer  # noqa: F401  Installs compat fix 0 before tests import Trax.
from terraformer import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Flags of jaxlib 0.10.2's XLA (an unknown flag in XLA_FLAGS aborts JAX).
RENDEZVOUS_FLAGS = ('--xla_cpu_collective_call_warn_stuck_timeout_seconds=120',
                    '--xla_cpu_collective_call_terminate_timeout_seconds=600')

os.environ.setdefault(runtime.COMPILATION_CACHE_ENV,
                      os.path.join(ROOT, '.pytest_compilation_cache'))
os.environ.setdefault(runtime.CACHE_MIN_COMPILE_SECS_ENV, '0.02')
runtime.use_compilation_cache(runtime.compilation_cache_dir())
COMPILE_FLAGS = ('--xla_backend_optimization_level=0',
                 '--xla_llvm_disable_expensive_passes=true',
                 '--xla_cpu_use_fusion_emitters=false',
                 '--xla_cpu_parallel_codegen_split_count=1')

os.environ['XLA_FLAGS'] = ' '.join(
    [os.environ.get('XLA_FLAGS', '')] +
    [f for f in RENDEZVOUS_FLAGS + COMPILE_FLAGS
     if f.split('=')[0] not in os.environ.get('XLA_FLAGS', '')]).strip()

# The `slow` tier: tests that take more than ~10 s (call and setup) in a run
# of the suite on the 2-core machine (2 workers; `pytest --durations=0`).
# This is where the threshold is stated; pytest.ini, scripts/test.sh and
# CONTRIBUTING.md refer to it here.
# `bash scripts/test.sh --fast` (`-m 'not slow'`) leaves them out. One list,
# here: node ids relative to tests/, or their prefixes (a file, a test, a
# parametrized case). tests/test_tiers.py fails on an entry that matches no
# test of a collected file (a renamed or removed test) and on a
# `@pytest.mark.slow` decorator (it would bypass the list), and checks that
# the fast tier still imports every module.
SLOW = (
    'benchmarks/test_decode_configs.py::test_kernel_configs_report_their_path_bytes_and_agreement',
    'benchmarks/test_decode_configs.py::test_projection_equals_the_deeper_model',
    'benchmarks/test_decode_configs.py::test_user_path_decodes_what_trax_decodes',
    'benchmarks/test_decode_speed.py::test_fast_predict_matches_eval_forward_and_donates_the_state',
    'benchmarks/test_param_count.py::test_800m_model_counted_without_allocating',
    'benchmarks/test_weight_factory.py::test_model_with_stored_random_weights_decodes_on_both_paths',
    'cli/test_cli_bench.py::test_agreement_of_every_variant_on_a_trained_checkpoint',
    'cli/test_cli_bench.py::test_agreement_sees_noisy_weights_and_reads_a_prompt_file',
    'cli/test_cli_bench.py::test_agreement_table_and_json',
    'cli/test_cli_bench.py::test_console_script',
    'cli/test_cli_bench.py::test_sweep_writes_plot_and_json',
    'cli/test_cli_bench.py::test_table_and_json',
    'cli/test_cli_decode.py',
    'cli/test_cli_eval.py::test_examples_fn_binding',
    'cli/test_cli_eval.py::test_log_perplexity_matches_the_training_eval',
    'cli/test_cli_eval.py::test_rouge_matches_rouge_score_on_the_jsonl',
    'cli/test_cli_eval.py::test_user_errors',
    'cli/test_cli_import_trax.py::test_imports_a_checkpoint_that_eval_and_decode_load',
    'cli/test_cli_info.py::test_compiled_fsdp_step_memory_falls_with_devices',
    'cli/test_cli_memory_bench.py::test_length_table_and_budget',
    'cli/test_cli_memory_bench.py::test_memory_grows_slower_with_length_when_pooled',
    'cli/test_cli_memory_bench.py::test_reversible_memory_grows_slower_with_depth',
    'cli/test_cli_memory_bench.py::test_table',
    'cli/test_cli_ood.py::test_tiny_table_end_to_end_then_skip',
    'cli/test_cli_train.py::test_console_script_end_to_end',
    'cli/test_cli_train.py::test_damaged_newest_checkpoint_disk_full_and_nan',
    'data/test_c4.py::test_aclsum_source_masks_the_real_paper_bodies',
    'data/test_c4.py::test_real_c4_feature_spec_with_random_mock_examples',
    'data/test_c4.py::test_repeat_is_endless',
    'data/test_long_range_recall.py::test_pyramidion_pairing_trains_a_few_steps',
    'decoding/test_search.py::test_batched_equals_one_by_one',
    'decoding/test_search.py::test_beam_scores_are_eval_log_probs',
    'decoding/test_search.py::test_decode_leaves_the_model_untouched',
    'decoding/test_search.py::test_encdec_predict_decoding_matches_eval_forward',
    'decoding/test_search.py::test_greedy_matches_trax_autoregressive_sample',
    'decoding/test_search.py::test_lm_predict_decoding_matches_eval_forward[sparse_ff_qkv_loss]',
    'decoding/test_search.py::test_state_donating_step_fn',
    'decoding/test_search.py::test_terraformer_decoding_matches_eval_forward',
    'kernels/test_cache_attention.py::test_decoding_step_reads_cache_in_place',
    'kernels/test_kernels.py::test_decode_with_kernels_equals_xla[encdec]',
    'kernels/test_kernels.py::test_sparse_ff_kernel_equals_xla_layer[int8-scalar-serial-96-4]',
    'kernels/test_kernels.py::test_weight_storage',
    'models/test_long_inputs.py::test_blockwise_encoder_with_one_block_is_full_attention',
    'models/test_long_inputs.py::test_cst_terraformer_decodes_as_it_evaluates',
    'models/test_long_inputs.py::test_gradients_reach_the_pooling_scorer',
    'models/test_long_inputs.py::test_pooled_encoder_decoder_decodes_as_it_evaluates[blockwise]',
    'models/test_long_inputs.py::test_pooled_terraformer_decodes_as_it_evaluates',
    'models/test_padding_independence.py::test_scaling_transformer_padding_independent[dense]',
    'models/test_padding_independence.py::test_terraformer_padding_independent[sparse_qkv]',
    'models/test_padding_independence.py::test_terraformer_padding_independent[sru_sparse_ff]',
    'models/test_scaling_transformer.py::test_encoder_decoder_predict_matches_eval_forward[dense]',
    'models/test_scaling_transformer.py::test_encoder_decoder_predict_matches_eval_forward[sparse_ff_qkv_loss]',
    'models/test_scaling_transformer.py::test_encoder_padding_is_masked[dense]',
    'models/test_scaling_transformer.py::test_encoder_padding_is_masked[local_conv]',
    'models/test_terraformer.py',
    'test_gin_configs.py',
    'test_main_job.py',
    'test_runtime.py::test_import_is_quiet_unless_asked_and_applies_the_fixes',
    'training/test_distributed.py::test_the_coordinators_death_is_one_line_on_its_peer',
    'training/test_distributed.py::test_train_cli_fsdp_over_2_processes_equals_trax_loop_and_resumes',
    'training/test_distributed.py::test_train_cli_two_processes_killed_and_resumed_equals_one_process',
    'training/test_finetune.py::test_fine_tuning_starts_from_the_checkpoint_weights',
    'training/test_finetune.py::test_init_checkpoint_accepts_a_trax_checkpoint',
    'training/test_finetune.py::test_optimizer_state_starts_fresh',
    'training/test_finetune.py::test_resuming_takes_precedence_over_init_checkpoint',
    'training/test_loop.py::test_data_parallel_on_two_devices',
    'training/test_loop.py::test_resume_continues_from_checkpoint',
    'training/test_loop.py::test_resume_with_other_bindings_rewrites_config_gin[fsdp]',
    'training/test_resume_sweep.py',
    'training/test_resume_sweep_devices.py',
    'training/test_sharded_trainer.py::test_a_dead_process_stops_the_other_with_one_line',
    'training/test_sharded_trainer.py::test_a_process_that_never_joins_is_a_bounded_error',
    'training/test_sharded_trainer.py::test_sharded_over_8_devices_equals_one_device',
    'training/test_soak.py::test_two_kills_resume_exactly_with_random_draws',
    'trax_bridge/test_checkpoint_import.py::test_encoder_decoder_import_matches_trax',
    'trax_bridge/test_checkpoint_import.py::test_lm_import_matches_trax',
    'trax_bridge/test_checkpoint_import.py::test_terraformer_import_matches_trax',
    'trax_bridge/test_checkpoint_import.py::test_terraformer_lsh_import_matches_trax_with_the_same_hashing',
    'trax_bridge/test_compat.py::test_init_gives_the_weights_and_state_of_traxs_init[train-_small_terraformer]',
    'trax_bridge/test_compat.py::test_multi_device_replication_and_step',
)

# The longest files start first, longest first (their durations, slow tests
# included, measured file by file with `pytest --durations=0` on the 2-core
# machine), so that with `pytest -n 2 --dist loadfile --no-loadscope-reorder`
# (scripts/test.sh) they do not end up alone at the end of the run while the
# other worker idles.
_LONGEST_FIRST = ('training/test_distributed.py',
                  'cli/test_cli_memory_bench.py',
                  'training/test_resume_sweep.py',
                  'models/test_terraformer.py', 'test_main_job.py',
                  'decoding/test_search.py', 'test_gin_configs.py',
                  'training/test_resume_sweep_devices.py',
                  'training/test_sharded_trainer.py',
                  'models/test_long_inputs.py',
                  'trax_bridge/test_checkpoint_import.py',
                  'cli/test_cli_bench.py', 'cli/test_cli_ood.py',
                  'cli/test_cli_decode.py', 'kernels/test_kernels.py',
                  'benchmarks/test_decode_configs.py', 'training/test_loop.py',
                  'training/test_soak.py', 'cli/test_cli_eval.py',
                  'training/test_finetune.py',
                  'models/test_scaling_transformer.py',
                  'models/test_padding_independence.py',
                  'trax_bridge/test_compat.py')


def _test_id(item):
  """The node id of `item` relative to tests/ ('cli/test_x.py::test_y')."""
  path, _, rest = item.nodeid.partition('::')
  path = os.path.relpath(os.path.join(str(item.config.rootpath), path),
                         os.path.dirname(os.path.abspath(__file__)))
  return path.replace(os.sep, '/') + ('::' + rest if rest else '')


def _matches(test_id, entry):
  return test_id == entry or test_id.startswith(
      entry + ('[' if '::' in entry else '::'))


def mark_slow(items, slow=SLOW, partly_collected=()):
  """Marks the items that `slow` names; returns what is wrong with the list
  (lines for tests/test_tiers.py): entries that match no test of their
  collected file (not of a file in `partly_collected`, of which the command
  line named some tests), tests a decorator marked slow."""
  ids = [_test_id(i) for i in items]
  problems = [f'{i}: marked by a decorator, not by SLOW in tests/conftest.py'
              for i, item in zip(ids, items) if item.get_closest_marker('slow')]
  files = {i.split('::')[0] for i in ids} - set(partly_collected)
  problems += [f'SLOW in tests/conftest.py: {e!r} matches no test'
               for e in slow if e.split('::')[0] in files
               and not any(_matches(i, e) for i in ids)]
  for item, test_id in zip(items, ids):
    if any(_matches(test_id, e) for e in slow):
      item.add_marker(pytest.mark.slow)
  return problems


# What is wrong with SLOW, seen when this process collected its tests.
SLOW_PROBLEMS = []


@pytest.hookimpl(tryfirst=True)  # Before `-m` deselects by marker.
def pytest_collection_modifyitems(config, items):
  here = os.path.dirname(os.path.abspath(__file__))
  named = {os.path.relpath(os.path.abspath(a.split('::')[0]), here).replace(
      os.sep, '/') for a in config.args if '::' in a}
  SLOW_PROBLEMS[:] = mark_slow(items, partly_collected=named)

  def rank(item):
    path = str(item.fspath).replace('\\', '/')
    for i, name in enumerate(_LONGEST_FIRST):
      if path.endswith('/' + name):
        return i
    return len(_LONGEST_FIRST)
  items.sort(key=rank)  # stable: the order within a file is kept


# TERRAFORMER_TEST_CPU_REPORT=N: after the run, the N test files and the N
# tests that took the most CPU seconds, each test's own (its process, all
# threads) plus its waited-for child processes' (the CLIs it starts). On the
# 2-core machine the suite is CPU-bound, so CPU, not wall time (inflated by
# the third worker), says what a change of a test saves.
CPU_REPORT_ENV = 'TERRAFORMER_TEST_CPU_REPORT'
CPU_BY_TEST = {}  # test id -> [own, children] CPU seconds


def _cpu_seconds():
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return (own.ru_utime + own.ru_stime,
          children.ru_utime + children.ru_stime)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
  if not os.environ.get(CPU_REPORT_ENV):
    yield
    return
  before = _cpu_seconds()
  yield  # setup, call, teardown (module fixtures count for their first test)
  after = _cpu_seconds()
  CPU_BY_TEST[_test_id(item)] = [a - b for a, b in zip(after, before)]


def pytest_sessionfinish(session):
  output = getattr(session.config, 'workeroutput', None)  # An xdist worker.
  if output is not None and CPU_BY_TEST:
    output['cpu_by_test'] = json.dumps(CPU_BY_TEST)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # pylint: disable=unused-argument
  CPU_BY_TEST.update(json.loads(
      getattr(node, 'workeroutput', {}).get('cpu_by_test', '{}')))


def cpu_report(cpu_by_test, top):
  """Lines: the total, then the `top` files and tests by CPU seconds."""
  by_file = collections.Counter()
  for test_id, seconds in cpu_by_test.items():
    by_file[test_id.split('::')[0]] += sum(seconds)
  by_test = sorted(cpu_by_test.items(), key=lambda kv: -sum(kv[1]))[:top]
  total = sum(by_file.values())
  children = sum(c for _, c in cpu_by_test.values())
  lines = [f'CPU seconds of {len(cpu_by_test)} tests: {total:.0f} '
           f'({children:.0f} in child processes)',
           f'files (the {top} most):']
  lines += [f'{s:8.1f}  {f}' for f, s in by_file.most_common(top)]
  lines.append(f'tests (the {top} most): own + children')
  lines += [f'{own + ch:8.1f}  {own:7.1f} + {ch:7.1f}  {t}'
            for t, (own, ch) in by_test]
  return lines


def pytest_terminal_summary(terminalreporter):
  top = os.environ.get(CPU_REPORT_ENV)
  if top and CPU_BY_TEST:
    terminalreporter.section('CPU seconds by test file and test')
    for line in cpu_report(CPU_BY_TEST, int(top)):
      terminalreporter.write_line(line)
