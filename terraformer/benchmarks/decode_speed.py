"""Unbatched decoding speed of predict-mode models (paper Tables 1, 2, 6, 7).

The paper's headline figure is the time to decode ONE token, batch 1, on CPU.
That step is memory-bound: it reads every weight it touches once and does
little arithmetic per byte. So next to the measured time each result carries
the bytes of weights and caches a step reads (`bytes_read.step_bytes`) and
the bound they give, `bytes / GEMV bandwidth` (the bandwidth measured in the
same process, `gemv_bandwidth`): a sparse model is fast because it reads few
bytes, and an implementation is good when it runs close to that bound.

Some steps are bound by arithmetic instead (the multiplicative layers: S d M
multiply-adds for the bytes of a d x (S + M) layer): each result also
carries the int8 and float multiply-adds of a step (`step_macs`) and the time
they take at the peak rates of the kernels' int8 and float32 instructions
(`kernels.peak_macs`, on this process's cores, measured between rounds like
the bandwidth); the bound is the larger of the two.

The step timed is `terraformer.decoding.step.make_step`, the one decoding
uses, with random weights (`weight_factory`); this module times it.
"""
import contextlib
import collections
import gc
import os
import resource
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from terraformer import kernels as kernel_lib
from terraformer.benchmarks import bytes_read
from terraformer.benchmarks import step_macs as step_macs_lib
from terraformer.benchmarks import weight_factory
from terraformer.decoding import step as decode_step


# ---------------------------------------------------------------------------
# Memory bandwidth.


def call_seconds(fn, args, repeats):
  """Seconds of each of `repeats` calls `fn(*args)` (a jitted function),
  waited for, after one untimed call (compilation)."""
  fn(*args).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn(*args).block_until_ready()
    times.append(time.perf_counter() - start)
  return times


def _read_rate(fn, args, size, repeats):
  """(median, best) GB/s of `fn(*args)` reading `size` bytes."""
  times = call_seconds(fn, args, repeats)
  return size / np.median(times) / 1e9, size / min(times) / 1e9


class GemvProbe:
  """The read-bandwidth probe: GB/s (median, best) of the faster of two
  one-row products over a `megabytes` matrix: XLA's jitted float32 GEMV
  and, when the kernels are built, the Q8 GEMV kernel over int8 weights
  (`kernels.q8_matmul`; a dense Q8 17B step read faster than XLA's GEMV
  did on the same day, so that one alone set bounds below what a step
  reached). The matrices are made once and kept until `close()`, so that
  `time_models` can measure between rounds of repeats."""

  def __init__(self, megabytes=256):
    self.megabytes = megabytes
    self._operands = None

  def _make(self):
    cols = 1024
    rows = self.megabytes * 2**20 // (4 * cols)
    rng = np.random.default_rng(0)
    matrix = jnp.asarray(rng.standard_normal((rows, cols), dtype=np.float32))
    readers = [(jax.jit(jnp.dot), (matrix, jnp.ones((cols,), jnp.float32)),
                matrix.size * 4)]
    if kernel_lib.available():
      k, n = 4096, self.megabytes * 2**20 // 4096
      groups = -(-n // 16)
      packed = jnp.asarray(rng.integers(-127, 128, (groups, k // 4, 16, 4),
                                        dtype=np.int8))
      readers.append((jax.jit(kernel_lib.q8_matmul),
                      (jnp.ones((1, k), jnp.float32), packed,
                       jnp.ones((groups * 16,), jnp.float32)), packed.size))
    return readers

  def measure(self, repeats=10):
    if self._operands is None:
      self._operands = self._make()
    return max(_read_rate(fn, args, size, repeats)
               for fn, args, size in self._operands)

  def close(self):
    self._operands = None


def gemv_bandwidth(megabytes=256, repeats=10):
  """GB/s (median, best) of one `GemvProbe` measurement."""
  probe = GemvProbe(megabytes)
  try:
    return probe.measure(repeats)
  finally:
    probe.close()


# ---------------------------------------------------------------------------
# Multiply-add rate.


def peak_macs(seconds=0.05):
  """{'int8': MACs/s, 'float32': MACs/s}: the peak rates of the kernels'
  int8 instruction (the Q8 path in use) and float32 FMA on every core this
  process may run on (`kernels.peak_macs`, registers only); None without
  the kernels."""
  if not kernel_lib.available():
    return None
  threads = len(os.sched_getaffinity(0))
  peaks = {kind: kernel_lib.peak_macs(kind, threads, seconds)
           for kind in ('int8', 'float32')}
  return None if None in peaks.values() else peaks


def compute_ms(macs, peaks):
  """Milliseconds the multiply-adds `macs` ({'int8': n, 'float': n}) take
  at `peaks` (`peak_macs`)."""
  return 1e3 * (macs['int8'] / peaks['int8'] + macs['float'] / peaks['float32'])


# ---------------------------------------------------------------------------
# The machine a table was measured on.


def cpu_model(cpuinfo='/proc/cpuinfo'):
  """The CPU's name (the first 'model name' of /proc/cpuinfo), or None."""
  try:
    with open(cpuinfo, encoding='utf-8') as f:
      for line in f:
        key, _, value = line.partition(':')
        if key.strip() == 'model name':
          return value.strip()
  except OSError:
    pass
  return None


def machine(cpuinfo='/proc/cpuinfo'):
  """What a table's ratios depend on: the CPU and the kernels' paths.

  Returns:
    dict: cpu_model (/proc/cpuinfo's model name or None), cpu_cores,
    float_isa (the instruction set the float kernels run: 'avx512', 'avx2'
    or 'scalar', `kernels.set_isa()`), gemv_isa (the Q8 GEMV's: 'amx',
    'avx512vnni', 'avx2' or 'scalar', or the forced 'amx-emulated',
    `kernels.gemv_isa()`) and kernels
    (None when the library is loaded, else why not; both ISAs are then
    None and every model runs XLA's code).
  """
  built = kernel_lib.available()
  return {'cpu_model': cpu_model(cpuinfo), 'cpu_cores': os.cpu_count(),
          'float_isa': kernel_lib.set_isa() if built else None,
          'gemv_isa': kernel_lib.gemv_isa() if built else None,
          'kernels': None if built else kernel_lib.unavailable_reason()}


# ---------------------------------------------------------------------------
# Timing.


def _logits(outputs):
  return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


@jax.jit
def _greedy(logits):
  return jnp.argmax(logits[:, -1, :], axis=-1).astype(jnp.int32)[:, None]


# The trace annotation around DecodeTimer's timed steps.
TIMED_STEPS = 'terraformer_timed_steps'


@contextlib.contextmanager
def _first_call_donation_quiet():
  """The first call changes the state's structure (tl.Cache fills in): some
  donated buffers cannot be reused there, which JAX warns about."""
  with warnings.catch_warnings():
    warnings.filterwarnings('ignore', message='Some donated buffers')
    yield


class DecodeTimer:
  """Greedy decoding of one model with random weights, batch 1, timed.

  Each `repeat()` starts from empty caches: (enc-dec) one call with the
  `prompt_len`-token prompt runs the encoder, (LM) the prompt is fed token
  by token; then `tokens` steps are timed, each feeding the argmax of the
  previous logits, and the time per token (ms) is returned. The first
  repeat also compiles: `warm_up()` runs one untimed.

  `weights` (a float32 tree of the model's weight shapes, e.g. a trained
  checkpoint's) replaces the random weights, `prompt` (`prompt_len` token
  ids) the random prompt (ids 1..99).
  """

  def __init__(self, model, tokens=32, prompt_len=16, seed=0, shapes_=None,
               weights=None, prompt=None):
    decode_step.check_model(model)
    self.model, self.tokens, self.seed = model, tokens, seed
    self.encdec = decode_step.is_encoder_decoder(model)
    self.signature = decode_step.predict_signature(model, prompt_len)
    weight_shapes, self.state_shapes = shapes_ or decode_step.init_shapes(
        model, self.signature)
    step = decode_step.make_step(model)
    # Kernel layers' weights in their decode storage (bf16/int8), if asked.
    self.weights = weight_factory.decode_weights(model, weight_shapes, seed,
                                                 step, weights)
    self.decode_path = decode_step.describe_options(
        decode_step.model_options(model))
    if prompt is None:
      prompt = np.random.default_rng(seed).integers(1, 100, size=prompt_len)
    self.prompt = jnp.asarray(np.asarray(prompt, np.int32).reshape(
        1, prompt_len))
    self.rng = jax.random.PRNGKey(seed)
    # pure_fn restores the model's weights and state after each call: give
    # it the tree structure only (scalars), not a second set of caches.
    model.weights = self.weights
    model.state = jax.tree_util.tree_map(
        lambda s: np.zeros((), s.dtype), self.state_shapes)
    self._step = step.jitted
    self.steady_state = None    # State shapes after the first call.
    # Encoder positions primed into a decoder cache (step_bytes).
    self.encoder_len = prompt_len if self.encdec else 0
    self.first_position = None  # Decoder position of the first timed token.

  def _prime(self):
    """Empty caches + prompt; returns (state, first token to feed)."""
    step, weights, rng = self._step, self.weights, self.rng
    state = decode_step.zero_state(self.state_shapes)
    token = jnp.zeros((1, 1), jnp.int32)
    if self.encdec:
      outputs, state = step((self.prompt, token), weights, state, rng)
      token = _greedy(_logits(outputs))
      self.first_position = 1
    else:  # Positions 0..P-1 get 0, p_0, ..., p_{P-2}; then p_{P-1}.
      for t in range(self.prompt.shape[1]):
        _, state = step(token, weights, state, rng)
        token = self.prompt[:, t:t + 1]
      self.first_position = self.prompt.shape[1]
    if self.steady_state is None:
      self.steady_state = jax.tree_util.tree_map(
          lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    return state, token

  @property
  def step_module(self):
    """The step's HLO module name ('jit_' + its function's name), as a
    profile's events name it."""
    return 'jit_' + getattr(self._step, '__name__', 'pure_fn')

  def compiled_step_text(self):
    """The optimized HLO of the steady-state step (after the prompt), whose
    instruction names a profile's operation events carry."""
    with _first_call_donation_quiet():
      state, token = self._prime()
    x = (self.prompt, token) if self.encdec else token
    return self._step.lower(x, self.weights, state,
                            self.rng).compile().as_text()

  def repeat(self):
    """Decodes `tokens` tokens from empty caches; returns ms per token."""
    step, weights, rng = self._step, self.weights, self.rng
    with _first_call_donation_quiet():
      state, token = self._prime()
      jax.block_until_ready(token)
      # Marks the timed steps in a profile (step_profile; free otherwise).
      with jax.profiler.TraceAnnotation(TIMED_STEPS):
        start = time.perf_counter()
        for _ in range(self.tokens):
          x = (self.prompt, token) if self.encdec else token
          outputs, state = step(x, weights, state, rng)
          token = _greedy(_logits(outputs))
        jax.block_until_ready(token)
        elapsed = time.perf_counter() - start
    del state, outputs
    return 1e3 * elapsed / self.tokens

  def warm_up(self):
    self.repeat()

  def _start(self):
    """(state, token) before the first target position: an encoder-decoder's
    empty caches and 0 (its first step reads the prompt, as training's
    shifted decoder input starts with 0), an LM's caches after the prompt
    and its last token."""
    if self.encdec:
      return (decode_step.zero_state(self.state_shapes),
              jnp.zeros((1, 1), jnp.int32))
    return self._prime()

  def logits(self, feed=None, n=None):
    """(logits [n, vocab] float32, greedy tokens [n]) of one decode.

    Row t predicts target position t (n: `tokens`) from the prompt and the
    tokens fed before it: this model's own argmax, or `feed[t]` when given
    (another model's greedy tokens, or reference targets), so that two
    models' logits are compared at the same positions.
    """
    step, weights, rng = self._step, self.weights, self.rng
    with _first_call_donation_quiet():
      state, token = self._start()
      rows, own = [], []
      for t in range(self.tokens if n is None else n):
        x = (self.prompt, token) if self.encdec else token
        outputs, state = step(x, weights, state, rng)
        last = _logits(outputs)
        rows.append(np.asarray(last[0, -1], np.float32))
        own.append(int(_greedy(last)[0, 0]))
        token = (jnp.asarray([[feed[t]]], jnp.int32) if feed is not None
                 else _greedy(last))
    del state
    return np.stack(rows), own

  def forced_logits(self, targets, prompt=None):
    """Logits [len(targets), vocab] float32 of a teacher-forced decode: row
    t predicts targets[t] from the prompt and targets[:t]. `prompt`
    (prompt_len token ids) replaces the timer's prompt first (same shape:
    no recompilation)."""
    if prompt is not None:
      self.prompt = jnp.asarray(np.asarray(prompt, np.int32).reshape(
          self.prompt.shape))
    return self.logits(feed=targets, n=len(targets))[0]

  def step_bytes(self):
    """(bytes by layer class, total): step_bytes averaged over the timed
    positions."""
    if self.steady_state is None:
      self.warm_up()
    totals = collections.Counter()
    for position in range(self.first_position,
                          self.first_position + self.tokens):
      totals.update(bytes_read.step_bytes(
          self.model, self.weights, self.steady_state, position,
          encoder_len=self.encoder_len))
    by_layer = {k: v / self.tokens for k, v in totals.items()}
    return by_layer, sum(by_layer.values())

  def step_macs(self):
    """{'int8': n, 'float': n}: step_macs totals averaged over the timed
    positions; None for a model with a layer `step_macs` does not count."""
    if self.steady_state is None:
      self.warm_up()
    totals = collections.Counter()
    try:
      for position in range(self.first_position,
                            self.first_position + self.tokens):
        totals.update(step_macs_lib.total_macs(step_macs_lib.step_macs(
            self.model, self.weights, self.steady_state, position,
            encoder_len=self.encoder_len)))
    except NotImplementedError:
      return None
    return {kind: totals[kind] / self.tokens for kind in ('int8', 'float')}

  @property
  def n_params(self):
    return sum(int(np.prod(l.shape, dtype=np.int64))
               for l in jax.tree_util.tree_leaves(self.weights))

  def memory_by_kind(self):
    """{kind: bytes} of the weights held (`weight_factory.memory_by_kind`)
    and 'state (caches)' after the first call."""
    out = weight_factory.memory_by_kind(self.model, self.weights)
    if self.steady_state is not None:
      out['state (caches)'] = bytes_read.nbytes(self.steady_state)
    return out

  def close(self):
    """Frees the weights (the model keeps None leaves)."""
    to_none = lambda tree: jax.tree_util.tree_map(lambda _: None, tree)
    self.model.weights = to_none(self.model.weights)
    self.model.state = to_none(self.model.state)
    self.weights = None
    self._step = None


def peak_rss_bytes():
  """Peak resident memory of this process (bytes; Linux ru_maxrss)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _available_memory():
  """Bytes of memory available (MemAvailable), or None if unknown."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def time_models(models, tokens=32, prompt_len=16, repeats=5, seed=0,
                memory_budget=None, log=None, probe=None, peaks=peak_macs):
  """Times several models, interleaving their repeats to share the noise.

  With a `probe` (GemvProbe), each round of repeats is followed by a
  bandwidth measurement, and each model's result carries the median of its
  group's (`bandwidth_gbps`, and every round's in
  `bandwidth_gbps_rounds`): the machine's read bandwidth drifts within
  minutes, so a model's bound uses the bandwidth of the minutes it ran.

  Models whose weights and state fit together in `memory_budget` bytes
  (default: 40% of the available memory; a process holding models of N bytes
  needs about 1.4 N) are held at once and timed in
  rounds, one repeat of each per round; larger sets are split into such
  groups, in order.

  `peaks` (`peak_macs`, or None) is measured after each round too (after the
  bandwidth probe), and each model's result carries the median of its
  group's per kind (`peak_macs`) beside its multiply-adds per token
  (`macs_per_token`, `DecodeTimer.step_macs`).

  Models whose weights are created in their decode storage
  (`bench_weights.created='stored'`) count those stored bytes.

  Returns:
    one dict per model: ms_per_token_repeats, bytes_by_layer,
    bytes_per_token, macs_per_token (or None), n_params, decode_path,
    memory_by_kind (bytes of the weights held, by layer class and dtype, and
    of the caches).
  """
  if memory_budget is None:
    available = _available_memory()
    memory_budget = 0.4 * available if available else float('inf')
  sizes, all_shapes = [], []
  for model in models:
    decode_step.check_model(model)
    shapes_ = decode_step.init_shapes(
        model, decode_step.predict_signature(model, prompt_len))
    all_shapes.append(shapes_)
    weight_shapes = shapes_[0]
    if weight_factory.weights_created(model) == 'stored':
      weight_shapes = jax.eval_shape(decode_step.prepare_model(model),
                                     weight_shapes)
    sizes.append(weight_factory.weights_memory(weight_shapes, model)
                 + bytes_read.nbytes(shapes_[1]))
  groups, group, used = [], [], 0
  for i, size in enumerate(sizes):
    if group and used + size > memory_budget:
      groups.append(group)
      group, used = [], 0
    group.append(i)
    used += size
  groups.append(group)
  results = [None] * len(models)
  for group in groups:
    timers = {}
    step_bytes_, macs = {}, {}
    for i in group:
      if log:
        log(f'model {i + 1}/{len(models)}: making {sizes[i] / 2**30:.2f} GiB '
            'of weights and caches')
      timers[i] = DecodeTimer(models[i], tokens, prompt_len, seed,
                              all_shapes[i])
      timers[i].warm_up()
      step_bytes_[i] = timers[i].step_bytes()
      macs[i] = timers[i].step_macs()
      if log:
        held = sum(timers[i].memory_by_kind().values())
        log(f'model {i + 1}/{len(models)}: {held / 2**30:.2f} GiB held')
    if log:
      log(f'timing {len(group)} model(s) together: {repeats} rounds')
    times = {i: [] for i in group}
    rates, peak_rounds = [], []
    for _ in range(repeats):
      for i in group:
        times[i].append(timers[i].repeat())
      if probe is not None:
        rates.append(probe.measure(repeats=5)[0])
      if peaks is not None:
        peak_rounds.append(peaks())
    probed = {'bandwidth_gbps': float(np.median(rates)),
              'bandwidth_gbps_rounds': [float(r) for r in rates]} if rates else {}
    if peak_rounds and None not in peak_rounds:
      probed['peak_macs'] = {
          kind: float(np.median([p[kind] for p in peak_rounds]))
          for kind in ('int8', 'float32')}
    for i in group:
      by_layer, total = step_bytes_[i]
      results[i] = {**probed, 'ms_per_token_repeats': times[i],
                    'bytes_by_layer': by_layer, 'bytes_per_token': total,
                    'macs_per_token': macs[i],
                    'n_params': timers[i].n_params,
                    'decode_path': timers[i].decode_path,
                    'memory_by_kind': timers[i].memory_by_kind()}
      timers[i].close()
    del timers
    gc.collect()
  return results


def measure_model(model, tokens=32, prompt_len=16, repeats=5, seed=0):
  """Times one predict-mode model and counts its step bytes (time_models)."""
  return time_models([model], tokens, prompt_len, repeats, seed)[0]


# ---------------------------------------------------------------------------
# Benchmarking.


ModelSpec = collections.namedtuple(
    'ModelSpec', ['name', 'model', 'base_model', 'n_blocks'])
ModelSpec.__doc__ = """A model to benchmark.

  name: label in tables.
  model: the predict-mode layer (not initialized: it gets random weights).
  base_model: the same model without decoder blocks (its embedding, cached
    encoder and logits), for the per-block figures; None if not available.
  n_blocks: number of decoder blocks of `model`, or None if unknown.
"""


def _result(spec, full, base, bandwidth_gbps):
  """A benchmark result from time_models' results for a spec's models."""
  ms = full['ms_per_token_repeats']
  result = {
      'name': spec.name, 'n_blocks': spec.n_blocks,
      'n_params': full['n_params'],
      'ms_per_token': float(np.median(ms)),
      'ms_per_token_min': float(min(ms)),
      'ms_per_token_max': float(max(ms)),
      'ms_per_token_repeats': [float(m) for m in ms],
      'bytes_per_token': full['bytes_per_token'],
      'bytes_by_layer': full['bytes_by_layer'],
      'ms_per_block': None, 'bytes_per_block': None,
      'decode_path': full.get('decode_path'),
      'memory_by_kind': full.get('memory_by_kind'),
  }
  # The bandwidth measured beside this model's repeats, else the run's.
  if full.get('bandwidth_gbps'):
    bandwidth_gbps = full['bandwidth_gbps']
    result['bandwidth_gbps_rounds'] = full['bandwidth_gbps_rounds']
  if base is not None:
    base_ms = float(np.median(base['ms_per_token_repeats']))
    result['ms_no_blocks'] = base_ms
    result['ms_per_block'] = (result['ms_per_token'] - base_ms) / spec.n_blocks
    result['bytes_per_block'] = (
        full['bytes_per_token'] - base['bytes_per_token']) / spec.n_blocks
  # The compute bound: the step's multiply-adds at the instructions' peak
  # rates measured beside its rounds (none when a layer is not counted).
  macs, peaks = full.get('macs_per_token'), full.get('peak_macs')
  compute = compute_block = None
  if macs and peaks:
    result['macs_per_token'] = macs
    result['peak_macs'] = peaks
    compute = result['compute_bound_ms_per_token'] = compute_ms(macs, peaks)
    if base is not None and base.get('macs_per_token'):
      per_block = {k: (macs[k] - base['macs_per_token'][k]) / spec.n_blocks
                   for k in macs}
      result['macs_per_block'] = per_block
      compute_block = compute_ms(per_block, peaks)
  if bandwidth_gbps:
    result['bandwidth_gbps'] = bandwidth_gbps
    bytes_bound = 1e3 * result['bytes_per_token'] / (bandwidth_gbps * 1e9)
    result['bytes_bound_ms_per_token'] = bytes_bound
    result['bound_ms_per_token'] = max(bytes_bound, compute or 0.0)
    result['achieved_over_bound'] = (result['ms_per_token'] /
                                     result['bound_ms_per_token'])
    if result['bytes_per_block'] is not None:
      result['bound_ms_per_block'] = max(
          1e3 * result['bytes_per_block'] / (bandwidth_gbps * 1e9),
          compute_block or 0.0)
  return result


def benchmark_all(specs, tokens=32, prompt_len=16, repeats=5, seed=0,
                  bandwidth_gbps=None, memory_budget=None, log=None,
                  probe=None, peaks=peak_macs):
  """Benchmarks ModelSpecs together: ms/token, ms/block, bytes, bound.

  All models (and base models) are timed by one `time_models` call, so
  repeats of models that fit in memory together are interleaved.

  The per-block figures are differences between `spec.model` and
  `spec.base_model` (no decoder blocks), divided by `spec.n_blocks`: the
  paper's "per block" column (Table 1) leaves out embedding and logits.

  Returns:
    one dict per spec: name, n_blocks, n_params, ms_per_token (median over
    repeats), ms_per_token_min/max/repeats, ms_per_block, ms_no_blocks,
    bytes_per_token, bytes_per_block, bytes_by_layer, with the kernels
    macs_per_token, peak_macs and compute_bound_ms_per_token and, given
    `bandwidth_gbps`, bytes_bound_ms_per_token, bound_ms_per_token (the
    larger of the bytes and compute bounds), bound_ms_per_block and
    achieved_over_bound (ms_per_token / bound_ms_per_token); with a
    `probe` (`time_models`), each spec's bound uses the bandwidth measured
    between its model's rounds (`bandwidth_gbps` of the result).
  """
  models, index = [], []
  for spec in specs:
    use_base = spec.base_model is not None and bool(spec.n_blocks)
    index.append((len(models), len(models) + 1 if use_base else None))
    models.append(spec.model)
    if use_base:
      models.append(spec.base_model)
  timed = time_models(models, tokens, prompt_len, repeats, seed,
                      memory_budget, log, probe, peaks)
  return [_result(spec, timed[i], None if j is None else timed[j],
                  bandwidth_gbps)
          for spec, (i, j) in zip(specs, index)]


def benchmark(spec, tokens=32, prompt_len=16, repeats=5, seed=0,
              bandwidth_gbps=None):
  """benchmark_all for one ModelSpec."""
  return benchmark_all([spec], tokens, prompt_len, repeats, seed,
                       bandwidth_gbps)[0]
