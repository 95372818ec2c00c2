"""terraformer-bench: decoding speed of gin-configured models, side by side.

Each model is one gin configuration (one or more files composed, plus the
common bindings); `decode_speed.benchmark_all` times it. This module turns gin
configurations into models, builds Trax 1.4.1's reference model with the
same settings (`trax.models.research.configurable_transformer`, the code the
paper's speed figures come from), and runs each mode of terraformer-bench:
the speed table, the 17B projection, the d_model sweep, the logit agreement,
the XLA operation counts, a traced step and the user's path. Each returns
numbers; `terraformer/cli/bench_format.py` makes the tables and the plot.
"""
import functools
import gc
import inspect
import os
import time

import gin
import jax
import numpy as np

from terraformer import config
from terraformer.benchmarks import decode_speed
from terraformer.benchmarks import step_profile
from terraformer.benchmarks import weight_factory
from terraformer.decoding import search as decoding
from terraformer.decoding import step as decode_step
from terraformer import errors
from terraformer.loading import model as loading_model
from terraformer.loading import vocab as loading_vocab

# Keyword arguments of model functions that set the number of decoder blocks.
BLOCK_KWARGS = ('n_decoder_layers', 'n_layers')
# ScalingTransformer keyword -> what the sweep multiplies by d / d_model.
SWEEP_SCALED = ('d_ff', 'n_heads', 'attention_sparsity')
DEFAULT_SWEEP_D_MODELS = (512, 1024, 2048, 4096)


# ---------------------------------------------------------------------------
# Models from gin.


def configured_model():
  """(model function, gin selector, effective keyword arguments).

  The model is the one bound to `terraformer.train.model` in the parsed gin
  config; the keyword arguments are its signature's defaults overridden by
  the gin bindings (what `model_fn(mode=...)` will use).
  """
  ref = config.model_reference()
  if not hasattr(ref, 'scoped_configurable_fn'):
    raise errors.TerraformerError(
        'terraformer.train.model must be a configurable reference '
        f'(@Model), not {ref!r}')
  model_fn = ref.scoped_configurable_fn
  kwargs = {}
  try:
    params = inspect.signature(ref.configurable.wrapped).parameters
    kwargs = {k: p.default for k, p in params.items()
              if p.default is not inspect.Parameter.empty}
  except (TypeError, ValueError, AttributeError):
    pass
  kwargs.update(gin.get_bindings(ref.selector))
  kwargs.pop('mode', None)
  return model_fn, ref.selector, kwargs


def blocks_kwarg(model_fn, kwargs=()):
  """The keyword setting `model_fn`'s decoder blocks (from its signature,
  else the first of BLOCK_KWARGS among its gin `kwargs`), or None."""
  try:
    params = inspect.signature(model_fn).parameters
  except (TypeError, ValueError):
    params = {}
  return next((k for k in BLOCK_KWARGS if k in params),
              next((k for k in BLOCK_KWARGS if k in kwargs), None))


def n_blocks_of(kwargs):
  """Number of decoder blocks in a model's keyword arguments, or None."""
  for name in BLOCK_KWARGS:
    if name in kwargs:
      return kwargs[name]
  return None


def _base_overrides(kwargs, kwarg):
  """Keyword overrides of the model without decoder blocks.

  It keeps one encoder block (when the model has an encoder): decoding
  steps never run the encoder, and the base model then takes little memory.
  """
  overrides = {kwarg: 0}
  if kwargs.get('n_encoder_layers'):
    overrides['n_encoder_layers'] = 1
  return overrides


def _fit_overrides(kwargs, kwarg, fit_blocks):
  """Keyword overrides of a model cut to `fit_blocks` decoder blocks.

  The encoder is dropped (0 blocks: embedding and norm only), since
  decoding steps read only its cached output, whose shape does not depend
  on its depth.
  """
  overrides = {kwarg: fit_blocks}
  if 'n_encoder_layers' in kwargs:
    overrides['n_encoder_layers'] = 0
  return overrides


def spec_from_gin(name, fit_blocks=None):
  """ModelSpec of the model in the parsed gin config (built now).

  With `fit_blocks`, the model is built with that many decoder blocks and
  no encoder blocks (see `project`).
  """
  model_fn, _, kwargs = configured_model()
  kwarg = blocks_kwarg(model_fn, kwargs)
  overrides = {}
  if fit_blocks is not None:
    if not kwarg:
      raise errors.TerraformerError(
          f'--project_layers: {name} has no decoder-blocks argument '
          f'({" or ".join(BLOCK_KWARGS)})')
    overrides = _fit_overrides(kwargs, kwarg, fit_blocks)
    kwargs = dict(kwargs, **overrides)
  n_blocks = n_blocks_of(kwargs)
  model = model_fn(mode='predict', **overrides)
  decode_step.check_model(model)
  options = decode_step.bind_options(model)  # This config's kernels/storage.
  created = weight_factory.bind_bench_weights(model)  # And its random weights.
  base = None
  if kwarg and n_blocks:
    base = model_fn(mode='predict', **dict(
        overrides, **_base_overrides(kwargs, kwarg)))
    decode_step.bind_options(base, options)
    weight_factory.bind_bench_weights(base, created)
  return decode_speed.ModelSpec(name, model, base, n_blocks)


def is_dense(selector, kwargs):
  """True for a dense Transformer: no `*sparsity` keyword set (sparse FF,
  QKV, loss, encoder or cross attention) and not a Terraformer (LSH
  attention, reversible blocks)."""
  return (selector.split('.')[-1] != 'Terraformer' and
          not any(v for k, v in kwargs.items() if k.endswith('sparsity')))


def model_kind():
  """What the dense baseline of the parsed config's model is matched on:
  dict of dense (`is_dense`), d_model and decode_options ([kernels,
  storage], `decode_step.decode_options`)."""
  _, selector, kwargs = configured_model()
  return {'dense': is_dense(selector, kwargs),
          'd_model': kwargs.get('d_model'),
          'decode_options': list(decode_step.decode_options())}


def paper_seconds():
  """`PAPER_DECODE_SECONDS` of the parsed gin config (the paper's s/token of
  that model), or None."""
  try:
    return float(gin.query_parameter('%PAPER_DECODE_SECONDS'))
  except (ValueError, TypeError):
    return None


# ---------------------------------------------------------------------------
# Trax 1.4.1's reference model.


def trax_reference_fn(selector, kwargs):
  """Trax's ConfigurableTransformer(LM) with a Scaling Transformer's settings.

  Sparse FF -> `ff_sparsity=(N, d_lowrank, temperature, quant_prob)` (Trax's
  SparseFF); sparse QKV -> `tl.MultiplicativeConvCausalAttention(sparsity=S,
  length_kernel_size=F)` for self-attention and `enc_dec_attention_sparsity=S`
  (sparse queries, no output layer) in encoder-decoder attention; sparse loss
  -> `loss_sparsity=S, loss_sparsity_type='mult'`. Dropout is 0 (Trax's
  predict-mode positional encoding refuses any other value).

  Returns:
    function(mode=..., **overrides) -> layer.
  """
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax.models.research import configurable_transformer as ct  # pylint: disable=g-import-not-at-top
  name = selector.split('.')[-1]
  if name not in ('ScalingTransformer', 'ScalingTransformerLM'):
    raise errors.TerraformerError(
        f'--compare_trax: no Trax reference for model {name!r} (only '
        'ScalingTransformer and ScalingTransformerLM)')
  k = kwargs
  n_ff = k.get('ff_sparsity', 0)
  ff_sparsity = ((n_ff, k.get('d_lowrank', 64), k.get('ff_temperature', 0.1),
                  k.get('ff_quant_prob', 0.3)) if n_ff else 0)
  s_att = k.get('attention_sparsity', 0)
  max_len = k.get('max_len', 2048)
  if s_att:
    attention = functools.partial(
        tl.MultiplicativeConvCausalAttention, sparsity=s_att,
        length_kernel_size=k.get('attention_kernel_size', 3),
        max_inference_length=max_len)
  else:
    attention = functools.partial(tl.CausalAttention,
                                  max_inference_length=max_len)
  common = dict(d_model=k['d_model'], d_ff=k['d_ff'], n_heads=k['n_heads'],
                max_len=max_len, dropout=0.0, ff_dropout=0.0,
                ff_sparsity=ff_sparsity,
                loss_sparsity=k.get('loss_sparsity', 0),
                loss_sparsity_type='mult')
  if name == 'ScalingTransformer':
    return functools.partial(
        ct.ConfigurableTransformer, k['input_vocab_size'],
        output_vocab_size=k.get('output_vocab_size'),
        n_encoder_layers=k['n_encoder_layers'],
        n_decoder_layers=k['n_decoder_layers'],
        encoder_decoder_attention_type=attention,
        enc_dec_attention_sparsity=s_att, **common)
  return functools.partial(ct.ConfigurableTransformerLM, k['vocab_size'],
                           n_layers=k['n_layers'], attention_type=attention,
                           **common)


def trax_spec_from_gin(name):
  """ModelSpec of Trax's reference for the model in the parsed gin config."""
  _, selector, kwargs = configured_model()
  ref_fn = trax_reference_fn(selector, kwargs)
  n_blocks = n_blocks_of(kwargs)
  kwarg = 'n_decoder_layers' if 'n_decoder_layers' in kwargs else 'n_layers'
  model = ref_fn(mode='predict')
  base = (ref_fn(mode='predict', **_base_overrides(kwargs, kwarg))
          if n_blocks else None)
  return decode_speed.ModelSpec(name, model, base, n_blocks)


# ---------------------------------------------------------------------------
# Speed of each configuration (and of Trax's reference, or projected).


def run(configs, parse, tokens=32, prompt_len=16, repeats=5, seed=0,
        compare_trax=False, memory_budget=None, log=print,
        project_layers=None, fit_blocks=1):
  """Benchmarks each configuration (and Trax's reference for it) in one run.

  Models are timed with `decode_speed.benchmark_all`: the repeats of models
  that fit in memory together are interleaved, so they share the machine's
  noise (a Trax reference is timed next to the model it mirrors).

  Args:
    configs: list of (name, config) pairs; `parse(config, extra_bindings)`
      parses that model's gin configuration (raising TerraformerError on
      problems).
    parse: see above.
    tokens, prompt_len, repeats, seed: see `decode_speed.DecodeTimer`.
    compare_trax: also time Trax's reference model of each configuration.
    memory_budget: bytes of models held at once (see time_models).
    log: progress messages.
    project_layers: for models too large to hold: build each with
      `fit_blocks` decoder blocks and no encoder blocks, and project its
      ms/token and bytes to `project_layers` decoder blocks (`project`).
    fit_blocks: see above.

  Returns:
    dict: bandwidth_gbps (GEMV, median, before the timing),
    bandwidth_gbps_max, settings and models: one result per configuration
    (see `decode_speed.benchmark_all`; its bound uses the bandwidth
    measured between its own rounds of repeats, its `bandwidth_gbps`),
    with `config`, `speedup` (first model's ms/token over this one's),
    `speedup_per_block`, `paper_seconds` (the config's
    PAPER_DECODE_SECONDS or None), with compare_trax, `trax` (the
    reference's result), `speedup_over_trax` and
    `speedup_over_trax_per_block`, with project_layers the `projected_*`
    fields of `project`, and `model_kind`'s fields with the speedups over
    the dense model of the same decode options (`add_dense_speedups`).
  """
  if project_layers is not None and compare_trax:
    raise errors.TerraformerError(
        '--project_layers and --compare_trax cannot be combined')
  specs, papers, kinds = [], [], []
  for name, config in configs:  # Builds (and so checks) every model first.
    parse(config, [])
    papers.append(paper_seconds())
    kinds.append(model_kind())
    specs.append(spec_from_gin(
        name, None if project_layers is None else fit_blocks))
    if compare_trax:
      specs.append(trax_spec_from_gin('trax: ' + name))
  probe = decode_speed.GemvProbe()
  bandwidth, bandwidth_max = probe.measure()
  log(f'GEMV bandwidth: {bandwidth:.1f} GB/s (median), '
      f'{bandwidth_max:.1f} GB/s (best); measured again after each round '
      'of repeats: each model\'s bound uses its own rounds\' bandwidth')
  settings = dict(tokens=tokens, prompt_len=prompt_len, repeats=repeats,
                  seed=seed, batch_size=1)
  try:
    timed = decode_speed.benchmark_all(specs, tokens, prompt_len, repeats,
                                       seed, bandwidth, memory_budget, log,
                                       probe)
  finally:
    probe.close()
  del specs
  gc.collect()
  step = 2 if compare_trax else 1
  results = []
  for k, (name, config) in enumerate(configs):
    result = timed[step * k]
    result['config'] = config
    result['paper_seconds'] = papers[k]
    result.update(kinds[k])
    if project_layers is not None:
      project(result, project_layers)
    if compare_trax:
      trax = result['trax'] = timed[step * k + 1]
      result['speedup_over_trax'] = (trax['ms_per_token'] /
                                     result['ms_per_token'])
      result['speedup_over_trax_per_block'] = (
          trax['ms_per_block'] / result['ms_per_block']
          if trax['ms_per_block'] and result['ms_per_block'] else None)
    results.append(result)
  for result in results:
    _add_speedups(result, results[0])
    if project_layers is not None:
      result['projected_speedup'] = (results[0]['projected_ms_per_token'] /
                                     result['projected_ms_per_token'])
  add_dense_speedups(results)
  if project_layers is not None:
    settings.update(project_layers=project_layers, fit_blocks=fit_blocks)
  return {'bandwidth_gbps': bandwidth, 'bandwidth_gbps_max': bandwidth_max,
          'settings': settings, 'models': results,
          'peak_rss_bytes': decode_speed.peak_rss_bytes()}


def project(result, n_layers):
  """Adds a result's figures projected to `n_layers` decoder blocks.

  projected = (model without decoder blocks) + n_layers x (per block), for
  ms/token, bytes/token and multiply-adds/token (the bound: the larger of
  the bytes and compute bounds); the measured model had
  `result['n_blocks']` blocks and no encoder blocks (decoding steps never
  run the encoder).
  """
  if not result.get('ms_per_block'):
    raise errors.TerraformerError(
        f"--project_layers: no per-block time for {result['name']}")
  bytes_no_blocks = (result['bytes_per_token'] -
                     result['n_blocks'] * result['bytes_per_block'])
  result['projected_layers'] = n_layers
  result['projected_ms_per_token'] = (result['ms_no_blocks'] +
                                      n_layers * result['ms_per_block'])
  result['projected_bytes_per_token'] = (bytes_no_blocks +
                                         n_layers * result['bytes_per_block'])
  compute = None
  if result.get('macs_per_block') and result.get('peak_macs'):
    projected_macs = {
        k: result['macs_per_token'][k] + (n_layers - result['n_blocks']) *
        result['macs_per_block'][k] for k in result['macs_per_token']}
    compute = result['projected_compute_bound_ms_per_token'] = (
        decode_speed.compute_ms(projected_macs, result['peak_macs']))
  if result.get('bandwidth_gbps'):
    bytes_bound = result['projected_bytes_bound_ms_per_token'] = (
        1e3 * result['projected_bytes_per_token'] /
        (result['bandwidth_gbps'] * 1e9))
    result['projected_bound_ms_per_token'] = max(bytes_bound, compute or 0.0)


def add_dense_speedups(results):
  """Adds to each result its speedups over a dense model, measured and at
  the dense model's bound.

  A result's dense baseline is the first result of the run with `dense`
  set, the same decode options (kernels and storage) and the same d_model
  (`model_kind`): `dense_baseline` (its name, or None where the run has
  none), `speedup_vs_dense` (its ms/token over this one's, both measured)
  and `speedup_vs_dense_bound` (the dense model's bytes read at this
  model's bandwidth, over this one's ms/token: the speedup over a dense
  model that decoded at memory speed on the same memory, i.e. the bytes
  ratio over this model's distance from its bound; each model's bandwidth
  is probed in its own process, and a host's can differ between
  processes). Projected results (`project`) also get
  `projected_speedup_vs_dense` and `projected_speedup_vs_dense_bound` from
  their projected figures. None where a figure is missing.
  """
  ratio = lambda a, b: a / b if a and b else None
  for result in results:
    base = next((r for r in results if r.get('dense') and
                 r['decode_options'] == result['decode_options'] and
                 r['d_model'] == result['d_model']), None)
    result['dense_baseline'] = base['name'] if base else None
    base = base or {}
    for prefix in ('', 'projected_'):
      ms = result.get(f'{prefix}ms_per_token')
      if prefix and ms is None:
        continue
      result[f'{prefix}speedup_vs_dense'] = ratio(
          base.get(f'{prefix}ms_per_token'), ms)
      bytes_ratio = ratio(base.get(f'{prefix}bytes_per_token'),
                          result.get(f'{prefix}bytes_per_token'))
      # The dense model's bytes at this model's bandwidth (reports made
      # before the compute bound have the bytes bound alone).
      bound = result.get(f'{prefix}bytes_bound_ms_per_token',
                         result.get(f'{prefix}bound_ms_per_token'))
      dense_bound = bytes_ratio * bound if bytes_ratio and bound else None
      result[f'{prefix}speedup_vs_dense_bound'] = ratio(dense_bound, ms)


def _add_speedups(result, baseline):
  result['speedup'] = baseline['ms_per_token'] / result['ms_per_token']
  if result.get('ms_per_block') and baseline.get('ms_per_block'):
    result['speedup_per_block'] = (baseline['ms_per_block'] /
                                   result['ms_per_block'])
  else:
    result['speedup_per_block'] = None


# ---------------------------------------------------------------------------
# Logit agreement; XLA operations per decoder block; a traced step.


def _check_length(name, model, tokens, prompt_len):
  """TerraformerError unless the prompt and `tokens` fit the model's
  positions (Trax clamps the positions past them silently)."""
  limit = decoding.model_max_length(model)
  encdec = decode_step.is_encoder_decoder(model)
  need = max(prompt_len, tokens + 1) if encdec else prompt_len + tokens
  if limit and need > limit:
    raise errors.TerraformerError(
        f'{name}: --prompt_len={prompt_len} and --tokens={tokens} need '
        f'{need} positions, the model has {limit} (max_len)')


def prompt_tokens(path, prompt_len, encoder_decoder):
  """The prompt in a text file, tokenized with the parsed config's vocab
  (`terraformer.text_vocab`): an LM's first `prompt_len` tokens; an
  encoder-decoder's input as in training (`loading.vocab.encode_input`: ids
  + EOS, cut to `prompt_len`, padded with 0)."""
  try:
    with open(path, encoding='utf-8') as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise errors.TerraformerError(f'--prompt_file={path}: {e}') from None
  try:
    vocab = loading_vocab.text_vocab()
  except (ValueError, TypeError) as e:  # text_vocab.vocab_size not bound.
    raise errors.TerraformerError(
        f'--prompt_file: the config has no text vocab ({e})') from None
  if encoder_decoder:
    ids, _ = loading_vocab.encode_input(vocab, text, prompt_len)
    return ids + [0] * (prompt_len - len(ids))
  ids = list(vocab.encode(text))
  if len(ids) < prompt_len:
    raise errors.TerraformerError(
        f'--prompt_file={path} has {len(ids)} tokens, fewer than '
        f'--prompt_len={prompt_len}')
  return ids[:prompt_len]


def _float32_timer(mode, name, config, parse, tokens, prompt_len, seed, log,
                   checkpoint=None, prompt_of=None):
  """(DecodeTimer, checkpoint step, noise) of one configuration decoding
  the run's float32 weights: `weight_factory.random_weights(seed)`, or with
  `checkpoint` a trained checkpoint's (an `output_dir` of terraformer-train,
  loaded and checked as terraformer-decode loads it), in its own decode
  storage (`bench_weights.noise` perturbs them); `prompt_of(model)` gives
  its prompt (None: random ids)."""
  parse(config, [])
  spec = spec_from_gin(name)
  if weight_factory.weights_created(spec.model) != 'float32':
    raise errors.TerraformerError(
        f"{mode}: {name} sets bench_weights.created = 'stored': "
        'its weights would not be the float32 weights of the others')
  _check_length(name, spec.model, tokens, prompt_len)
  prompt = prompt_of(spec.model) if prompt_of else None
  weights, step = None, None
  if checkpoint:
    log(f'{mode[2:]}: {name}: weights of {checkpoint}')
    weights, step = loading_model.load_weights(
        spec.model, checkpoint,
        decode_step.predict_signature(spec.model, prompt_len))
  log(f'{mode[2:]}: {name}...')
  timer = decode_speed.DecodeTimer(spec.model, tokens, prompt_len, seed,
                                   weights=weights, prompt=prompt)
  return timer, step, weight_factory.weights_noise(spec.model)


def agreement(configs, parse, tokens=32, prompt_len=16, seed=0, log=print,
              checkpoint=None, prompt_file=None):
  """Logits of each configuration against the first's, the same weights.

  Every model gets the same float32 weights, `weight_factory.random_weights
  (seed)` or with `checkpoint` those of a trained checkpoint (an
  `output_dir` of terraformer-train, loaded and checked as terraformer-
  decode loads it), then its own decode storage (bf16/int8/q8 for kernel
  configs; `bench_weights.noise` perturbs them), and decodes `tokens`
  tokens after the same prompt (random ids, or `prompt_tokens` of
  `prompt_file`). Teacher-forced: the others are fed the first model's
  greedy tokens, so logits are compared position by position; up to the
  first position whose argmax differs, a free-running greedy decode would
  emit the same tokens. One model at a time is held in memory.

  Returns:
    list of dicts: name, config, decode_path, max_abs_logit_delta (vs the
    first), greedy_agreement (fraction of positions with the first's
    argmax), first_difference (the first such position that differs, None
    if none), greedy_tokens (the model's argmax at each position),
    max_abs_logit and min_top2_margin (the first's largest |logit| and
    smallest gap between its two largest logits: a |delta logit| below
    half of it cannot change an argmax), tokens, prompt ('random' or the
    file) and prompt_ids (its tokens), checkpoint and checkpoint_step (None for random weights), noise
    (`bench_weights.noise`).
  """
  results, reference, prompt = [], None, None

  def prompt_of(model):
    nonlocal prompt
    if prompt_file and prompt is None:
      prompt = prompt_tokens(prompt_file, prompt_len,
                             decode_step.is_encoder_decoder(model))
    return prompt

  for name, config in configs:
    timer, step, noise = _float32_timer(
        '--agreement', name, config, parse, tokens, prompt_len, seed, log,
        checkpoint, prompt_of)
    logits, own = timer.logits(None if reference is None else reference[1])
    path, prompt_ids = timer.decode_path, np.asarray(timer.prompt)[0]
    timer.close()
    del timer
    gc.collect()
    if reference is None:
      reference = (logits, own)
    ref_logits, ref_tokens = reference
    same = np.asarray(own) == np.asarray(ref_tokens)
    top2 = np.sort(ref_logits, axis=-1)[:, -2:]
    results.append({
        'name': name, 'config': config, 'decode_path': path,
        'max_abs_logit_delta': float(np.abs(logits - ref_logits).max()),
        'greedy_agreement': float(np.mean(same)),
        'first_difference': (None if same.all()
                             else int(np.argmin(same))),
        'greedy_tokens': [int(t) for t in own],
        'max_abs_logit': float(np.abs(ref_logits).max()),
        'min_top2_margin': float((top2[:, 1] - top2[:, 0]).min()),
        'tokens': tokens, 'prompt': prompt_file or 'random',
        'prompt_ids': [int(t) for t in prompt_ids],
        'checkpoint': checkpoint, 'checkpoint_step': step, 'noise': noise})
  return results


def reference_pairs(split, max_examples=None):
  """(inputs, targets) token lists of a split's (article, abstract) pairs
  as the config's summarization stream makes them (`summarization_stream`:
  ids + EOS, cut to its input_len / target_len; inputs zero-padded), read
  with `terraformer.data.summarization_pairs` (gin: its source, e.g. the
  offline aclsum papers)."""
  from terraformer.data import summarization  # pylint: disable=g-import-not-at-top
  input_len, target_len = loading_vocab.training_lengths()
  if not input_len or not target_len:
    raise errors.TerraformerError(
        '--quality: the config binds no input_len / target_len of a '
        'summarization stream')
  try:
    vocab = loading_vocab.text_vocab()
  except (ValueError, TypeError) as e:  # text_vocab.vocab_size not bound.
    raise errors.TerraformerError(
        f'--quality: the config has no text vocab ({e})') from None
  pairs = []
  for article, abstract in summarization.summarization_pairs(
      split=split, n_examples=max_examples):
    ids, _ = loading_vocab.encode_input(vocab, article, input_len)
    target = (list(vocab.encode(abstract)) + [vocab.eos_id])[:target_len]
    pairs.append((ids + [0] * (input_len - len(ids)), target))
  return pairs


def _log_softmax(logits):
  """log_softmax over the last axis, in float64 (KL of near-equal rows)."""
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def quality(configs, parse, split='test', max_examples=None, seed=0,
            log=print, checkpoint=None):
  """Teacher-forced quality of each configuration's decode path against the
  first's, the same weights, over the reference targets of a split.

  Every model decodes the same float32 weights (random, or `checkpoint`'s;
  as `agreement`) in its own decode storage, teacher-forced on each
  example's reference target (`reference_pairs`: the abstract after its
  article, as the training data made them); row t of `DecodeTimer.
  forced_logits` predicts target token t. Over all target positions of all
  examples (EOS included, as the eval's weighted loss counts them): the
  mean negative log-likelihood of the reference token (the eval's
  log-perplexity, nats per token), the share of positions whose top token
  is the reference token (accuracy), and against the first model the mean
  KL divergence KL(first || this) of the next-token distributions (nats),
  the share of positions with the first's top token and the largest
  |delta logit|: what 8-bit runtimes report of a quantized model.
  Encoder-decoder models only (an article and its abstract).

  Returns:
    list of dicts: name, config, decode_path, log_perplexity,
    log_perplexity_delta (minus the first's), accuracy, mean_kl,
    same_top_token, max_abs_logit_delta, positions, examples, split,
    input_len, target_len, checkpoint, checkpoint_step, noise.
  """
  pairs, results, reference = None, [], []
  for index, (name, config) in enumerate(configs):
    parse(config, [])
    if pairs is None:
      pairs = reference_pairs(split, max_examples)
      if not pairs:
        raise errors.TerraformerError(f'--quality: split {split!r} is empty')
      input_len = len(pairs[0][0])
      target_len = max(len(t) for _, t in pairs)

    def prompt_of(model, name=name):
      if not decode_step.is_encoder_decoder(model):
        raise errors.TerraformerError(
            f'--quality: {name} is not an encoder-decoder model')
      return pairs[0][0]

    timer, step, noise = _float32_timer(
        '--quality', name, config, parse, target_len, input_len, seed, log,
        checkpoint, prompt_of)
    nll, hits, kl, same, delta = [], [], [], [], 0.0
    for i, (inputs, targets) in enumerate(pairs):
      logits = timer.forced_logits(targets, prompt=inputs)
      logp = _log_softmax(logits)
      top = logp.argmax(axis=-1)
      nll.append(-logp[np.arange(len(targets)), targets])
      hits.append(top == np.asarray(targets))
      if index == 0:
        reference.append((logits, logp, top))
      ref_logits, ref_logp, ref_top = reference[i]
      kl.append((np.exp(ref_logp) * (ref_logp - logp)).sum(axis=-1))
      same.append(top == ref_top)
      delta = max(delta, float(np.abs(logits - ref_logits).max()))
    path = timer.decode_path
    timer.close()
    del timer
    gc.collect()
    log_ppl = float(np.concatenate(nll).mean())
    results.append({
        'name': name, 'config': config, 'decode_path': path,
        'log_perplexity': log_ppl,
        'log_perplexity_delta': (log_ppl - results[0]['log_perplexity']
                                 if results else 0.0),
        'accuracy': float(np.concatenate(hits).mean()),
        'mean_kl': float(np.concatenate(kl).mean()),
        'same_top_token': float(np.concatenate(same).mean()),
        'max_abs_logit_delta': delta,
        'positions': int(sum(len(t) for _, t in pairs)),
        'examples': len(pairs), 'split': split,
        'input_len': input_len, 'target_len': target_len,
        'checkpoint': checkpoint, 'checkpoint_step': step, 'noise': noise})
  return results


def xla_ops(configs, parse, blocks=(1, 3), prompt_len=16, log=print):
  """XLA operations per token and per decoder block of each configuration.

  Each model is compiled (from shapes only) with `blocks[0]` and `blocks[1]`
  decoder blocks and one encoder block; per block = the difference of their
  `step_profile.xla_op_counts` / the difference of blocks.

  Returns:
    list of dicts: name, ops_per_token (at blocks[1] blocks), ops_per_block
    and ops_per_block_by_kind.
  """
  results = []
  for name, config in configs:
    counts = []
    for n in blocks:
      parse(config, [])
      model_fn, _, kwargs = configured_model()
      kwarg = blocks_kwarg(model_fn, kwargs)
      if not kwarg:
        raise errors.TerraformerError(
            f'--xla_ops: {name} has no decoder-blocks argument')
      overrides = {kwarg: n}
      if 'n_encoder_layers' in kwargs:
        overrides['n_encoder_layers'] = 1
      log(f'xla ops: {name}, {n} decoder blocks...')
      counts.append(step_profile.xla_op_counts(
          model_fn(mode='predict', **overrides), prompt_len))
    kinds = set(counts[0]) | set(counts[1])
    by_kind = {k: (counts[1].get(k, 0) - counts[0].get(k, 0)) /
               (blocks[1] - blocks[0]) for k in sorted(kinds)}
    results.append({'name': name, 'config': config,
                    'ops_per_token': sum(counts[1].values()),
                    'ops_per_block': sum(by_kind.values()),
                    'ops_per_block_by_kind': {
                        k: v for k, v in by_kind.items() if v}})
  return results


def profile(configs, parse, profile_dir, tokens=32, prompt_len=16, seed=0,
            log=print):
  """A jax.profiler trace of `tokens` decoding steps of each configuration,
  and where a step's time goes (`step_profile.summarize`).

  Each model is warmed up first (compiles, untimed), then one
  `DecodeTimer.repeat` runs under the trace, written to
  `profile_dir/<name>`.

  Returns:
    list of dicts: name, config, trace_dir, tokens and summary (see
    `step_profile.summarize`).
  """
  report = []
  for name, config in configs:
    parse(config, [])
    model_fn, _, _ = configured_model()
    timer = decode_speed.DecodeTimer(model_fn(mode='predict'), tokens,
                                     prompt_len, seed)
    log(f'profile: {name}, warm-up (compiles)...')
    timer.warm_up()
    trace_dir = os.path.join(profile_dir, name.replace(os.sep, '_'))
    with jax.profiler.trace(trace_dir):
      timer.repeat()
    hlo, module = timer.compiled_step_text(), timer.step_module
    timer.close()
    summary = step_profile.summarize(trace_dir, module, tokens,
                                     decode_speed.TIMED_STEPS, hlo)
    report.append({'name': name, 'config': config, 'trace_dir': trace_dir,
                   'tokens': tokens, 'summary': summary})
  return report


# ---------------------------------------------------------------------------
# The user's path: whole decode calls, ours and Trax's.


def _timed_calls(call, reset, repeats):
  """(seconds of `repeats` calls of `call()`, each after `reset()`, the
  last call's output)."""
  times = []
  for _ in range(repeats):
    reset()
    start = time.perf_counter()
    out = jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
  return times, np.asarray(out)


def user_path(configs, parse, tokens=16, prompt_len=16, repeats=3, seed=0,
              log=print):
  """Whole greedy decode calls, as a user makes them: ours and Trax's.

  For each configuration (random weights, batch 1, a `prompt_len`-token
  input, `tokens` tokens, no EOS), times repeated calls of
  `terraformer.decoding.search.decode(model, inputs, max_length=tokens)` and of
  Trax 1.4.1's `trax.supervised.decoding.autoregressive_sample(model,
  inputs, temperature=0, max_length=tokens)` on the same predict-mode
  model. The first call of each compiles (Trax: `tl.Accelerate`, a jit of
  `pure_fn` without donation; ours: `decode_step.make_step`) and is
  reported apart.

  Returns:
    dict: settings and models: per configuration name, config,
    ours_ms_per_token / trax_ms_per_token (median over the calls after the
    first; lists in *_repeats), ours_first_call_s, trax_first_call_s,
    trax_over_ours (median Trax ms/token over ours) and same_tokens (both
    decoded the same tokens).
  """
  from trax.supervised import decoding as trax_decoding  # pylint: disable=g-import-not-at-top
  from terraformer.decoding import search as decoding  # pylint: disable=g-import-not-at-top
  results = []
  for name, config in configs:
    parse(config, [])
    model = spec_from_gin(name).model
    signature = decode_step.predict_signature(model, prompt_len)
    weight_shapes, state_shapes = decode_step.init_shapes(model, signature)
    model.weights = weight_factory.random_weights(weight_shapes, seed, model)
    prompt = np.random.default_rng(seed).integers(
        2, 100, size=(1, prompt_len)).astype(np.int32)

    def reset():
      model.state = decode_step.zero_state(state_shapes)

    ours = lambda: decoding.decode(model, prompt, max_length=tokens,
                                   eos_id=None, progress=False)
    # An LM's prompt: Trax feeds it in one call after the start token.
    trax = lambda: trax_decoding.autoregressive_sample(
        model, prompt, batch_size=1, temperature=0.0, eos_id=-1,
        max_length=tokens)
    log(f'user path: {name}: ours...')
    ours_s, ours_tokens = _timed_calls(ours, reset, repeats + 1)
    log(f'user path: {name}: Trax autoregressive_sample...')
    trax_s, trax_tokens = _timed_calls(trax, reset, repeats + 1)
    per_token = lambda s: [1e3 * t / tokens for t in s[1:]]
    result = {'name': name, 'config': config,
              'ours_ms_per_token_repeats': per_token(ours_s),
              'trax_ms_per_token_repeats': per_token(trax_s),
              'ours_first_call_s': ours_s[0], 'trax_first_call_s': trax_s[0],
              'same_tokens': bool(np.array_equal(ours_tokens, trax_tokens))}
    result['ours_ms_per_token'] = float(np.median(
        result['ours_ms_per_token_repeats']))
    result['trax_ms_per_token'] = float(np.median(
        result['trax_ms_per_token_repeats']))
    result['trax_over_ours'] = (result['trax_ms_per_token'] /
                                result['ours_ms_per_token'])
    results.append(result)
    model.weights = jax.tree_util.tree_map(lambda _: None, model.weights)
    del model
    gc.collect()
  return {'settings': dict(tokens=tokens, prompt_len=prompt_len,
                           repeats=repeats, seed=seed, batch_size=1),
          'models': results}


# ---------------------------------------------------------------------------
# The d_model sweep.


def sweep_bindings(selector, kwargs, d_model):
  """Gin bindings scaling a configuration to `d_model`.

  d_model is set; d_ff, n_heads and attention_sparsity are multiplied by
  d_model / (the configuration's d_model), so head and module sizes and the
  FF ratio stay as configured.
  """
  base = kwargs['d_model']
  bindings = [f'{selector}.d_model = {d_model}']
  for name in SWEEP_SCALED:
    value = kwargs.get(name)
    if value:
      scaled = value * d_model // base
      if scaled * base != value * d_model or scaled < 1:
        raise errors.TerraformerError(
            f'--sweep: {name}={value} at d_model={base} does not scale to '
            f'd_model={d_model}')
      bindings.append(f'{selector}.{name} = {scaled}')
  return bindings


def sweep(configs, parse, d_models=DEFAULT_SWEEP_D_MODELS, tokens=16,
          prompt_len=16, repeats=3, seed=0, memory_budget=None, log=print,
          on_row=None):
  """Speed of each configuration at each d_model; speedups over the first.

  Args:
    configs: list of (name, config); the first is the baseline (dense).
    parse: function(config, extra_bindings) parsing that gin configuration.
    on_row: called with each row (see below) as soon as it is measured, so
      that a long sweep shows its results as it goes.

  Returns:
    dict: bandwidth_gbps, d_models, rows: one per d_model with, per
    configuration name, its benchmark result, and speedup / per-block
    speedup of each configuration over the first, and over the dense model
    of its decode options (`add_dense_speedups`).
  """
  bandwidth, _ = decode_speed.gemv_bandwidth()
  rows = []
  for d_model in d_models:
    specs, kinds = [], []
    for name, config in configs:
      parse(config, [])
      _, selector, kwargs = configured_model()
      parse(config, sweep_bindings(selector, kwargs, d_model))
      kinds.append(model_kind())
      specs.append(spec_from_gin(name))
    log(f'sweep: d_model={d_model}...')
    timed = decode_speed.benchmark_all(specs, tokens, prompt_len, repeats,
                                       seed, bandwidth, memory_budget, log)
    del specs
    gc.collect()
    row = {'d_model': d_model,
           'models': {name: r for (name, _), r in zip(configs, timed)}}
    baseline = row['models'][configs[0][0]]
    for (name, _), kind in zip(configs, kinds):
      row['models'][name].update(kind)
      _add_speedups(row['models'][name], baseline)
    add_dense_speedups(list(row['models'].values()))
    rows.append(row)
    if on_row:
      on_row(row)
  return {'bandwidth_gbps': bandwidth, 'd_models': list(d_models),
          'names': [n for n, _ in configs], 'rows': rows,
          'settings': dict(tokens=tokens, prompt_len=prompt_len,
                           repeats=repeats, seed=seed, batch_size=1)}
