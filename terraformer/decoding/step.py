"""The jitted one-token decoding step of predict-mode models.

Unbatched decoding calls the model once per token (paper §1, Tables 1 and
6): the whole predict-mode model runs as ONE XLA computation per token, with
the state (key/value caches, convolution buffers, position counters) donated
so that caches are updated in place:

  step = make_step(model)                  # jitted, state donated
  outputs, state = step(x, weights, state, rng)

`FastPredict(model, weights, state)` wraps it as `outputs = fast(x)`. The
state passed in is consumed (its buffers are donated), so never reuse a
state after passing it to `step`. `terraformer.decoding.search` decodes with this
step; `terraformer.benchmarks.decode_speed` times it.

Any model following the project's predict contract works: enc-dec models
(`n_in == 2`) are called with `(inputs [B, L], prev_token [B, 1])`, the
first call running the encoder; decoder-only LMs with `prev_token [B, 1]`.

Fused kernels (`terraformer/kernels`): the gin switch
`decode_options.kernels` ('xla' default, or 'ffi') makes the step call
C++ kernels through XLA's FFI for the sparse FF block, the multiplicative
dense layers (sparse QKV, sparse loss) and dense layers; 'ffi' falls back
to XLA's code (with a warning) when the library is not built.
`decode_options.weights` ('float32', 'bfloat16', 'int8', 'q8') stores those
layers' matrices in that type (int8 with per-row scales; 'q8': int8 weights
and int8 activations, integer dot products, see `decode_options`).
"""
import copy
import warnings

import gin
import jax
import jax.numpy as jnp
import numpy as np
from trax import layers as tl
from trax import shapes

from terraformer import errors
from terraformer import kernels as kernel_lib
from terraformer.kernels import installer as kernel_installer
from terraformer.kernels import layers as kernel_layers

KERNEL_MODES = ('xla', 'ffi')


@gin.configurable(module='terraformer')
def decode_options(kernels='xla', weights='float32'):
  """The decode path's gin switches (checked): (kernels, weights).

  kernels: 'xla' (the XLA path) or 'ffi' (the C++ kernels; XLA's code, with
    a warning, when the library is not built).
  weights: storage of the kernel layers' matrices: 'float32', 'bfloat16',
    'int8' (per-row scales; float activations) or 'q8': the dense products
    (every tl.Dense, the multiplicative dense layers of sparse QKV and of
    the sparse loss) on int8 weights packed output-major with one scale per
    output AND int8 activations, each input row quantized once per call per
    block of 32 (llama.cpp's Q8_0), summed as integer dot products
    (`kernels.q8_matmul`: AMX tiles for many rows, AVX-512 VNNI, AVX2 or
    scalar, `kernels.gemv_isa()` says which); the sparse FF's rows as
    'int8'. Any kernels mode reads them ('xla' computes the same quantized
    products with XLA's dots).
  """
  if kernels not in KERNEL_MODES:
    raise errors.TerraformerError(
        f'decode_options.kernels must be one of {KERNEL_MODES}, got '
        f'{kernels!r}')
  if weights not in kernel_layers.STORAGES:
    raise errors.TerraformerError(
        f'decode_options.weights must be one of {kernel_layers.STORAGES}, '
        f'got {weights!r}')
  return kernels, weights


def kernels_in_use(kernels):
  """True when `kernels` mode runs the C++ kernels on this install."""
  return kernels != 'xla' and kernel_lib.available()


def describe_options(options=None):
  """'xla' / 'ffi (avx2)' / 'xla (no kernels: ...)', plus the storage;
  with 'q8' weights the kernels' path names the Q8 GEMV's instruction set
  too ('ffi (avx512, q8 avx512vnni), q8 weights')."""
  kernels, weights = options or decode_options()
  if kernels == 'xla':
    path = 'xla'
  elif kernel_lib.available():
    isa = kernel_lib.set_isa()
    if weights == 'q8':
      isa += f', q8 {kernel_lib.gemv_isa()}'
    path = f'ffi ({isa})'
  else:
    path = 'xla (kernels not built)'
  return path if weights == 'float32' else f'{path}, {weights} weights'


_OPTIONS_ATTR = '_terraformer_decode_options'


def bind_options(model, options=None):
  """Fixes `model`'s decode options now (default: the gin ones), for a step
  made later under another gin configuration (terraformer-bench)."""
  setattr(model, _OPTIONS_ATTR, options or decode_options())
  return getattr(model, _OPTIONS_ATTR)


def model_options(model, options=None):
  """`options`, else those bound to `model`, else the gin ones."""
  return options or getattr(model, _OPTIONS_ATTR, None) or decode_options()


def prepare_model(model, options=None):
  """Installs the kernel layers the options ask for; returns a function
  `weights -> stored weights` (identity for the plain XLA float32 path)."""
  kernels, weights = model_options(model, options)
  if kernels == 'xla' and weights == 'float32':
    return lambda w: w
  if kernels == 'ffi' and not kernel_lib.available():
    warnings.warn('decode_options.kernels=ffi but the kernels are not '
                  f'available ({kernel_lib.unavailable_reason()}): XLA path')
  kernel_installer.install(model, use_ffi=kernels != 'xla')
  return lambda w: kernel_layers.store_weights(model, w, weights)


def make_step(model, donate_state=True, options=None):
  """`step(x, weights, state, rng) -> (outputs, new_state)`, jitted.

  `jax.jit(model.pure_fn)` (Trax's `Layer.pure_fn`, what `model(x)` runs):
  one XLA computation per token for the whole model. With `donate_state`
  the state's buffers are donated to the call: key/value caches and
  convolution buffers are updated in place instead of copied every token,
  and the state passed in must not be used again. `model` must hold weights
  and state of the right tree structure (e.g. after `init`, or
  `model.weights, model.state = weights, state`): Trax's `pure_fn` restores
  them after the call.

  `options` (default: `model_options(model)`) may install kernel layers
  in `model` and store their weights in bf16/int8: `step` converts the
  float32 weights it is given once (cached while the same tree is passed);
  `step.jitted` takes already stored weights (`step.store_weights(w)`).
  """
  store = prepare_model(model, options)
  jitted = jax.jit(model.pure_fn, donate_argnums=(2,) if donate_state else ())
  cache = {}

  def step(x, weights, state, rng):
    if cache.get('raw') is not weights:
      cache['raw'], cache['stored'] = weights, store(weights)
    with warnings.catch_warnings():
      # The first call changes the state's structure (tl.Cache fills in),
      # so some donated buffers cannot be reused there: expected.
      warnings.filterwarnings('ignore', message='Some donated buffers')
      return jitted(x, cache['stored'], state, rng)

  step.jitted = jitted
  step.store_weights = store
  return step


class FastPredict:
  """A predict-mode model called through one jitted, state-donating step.

    fast = FastPredict(model, weights, state)
    logits = fast(x)              # like model(x), state kept in fast.state

  `weights` and `state` default to the model's own. The state given is
  consumed: `FastPredict` owns it.
  """

  def __init__(self, model, weights=None, state=None, rng=None,
               donate_state=True):
    self.model = model
    self.weights = model.weights if weights is None else weights
    self.state = model.state if state is None else state
    if weights is not None or state is not None:
      model.weights, model.state = self.weights, self.state
    self.rng = jax.random.PRNGKey(0) if rng is None else rng
    self._step = make_step(model, donate_state)

  def __call__(self, x):
    outputs, self.state = self._step(x, self.weights, self.state, self.rng)
    return outputs


def is_encoder_decoder(model):
  """True for `(inputs, targets)` models, False for decoder-only LMs."""
  return model.n_in >= 2


def check_model(model):
  """Raises TerraformerError unless `model` looks like a predict-mode model."""
  if not isinstance(model, tl.Layer):
    raise errors.TerraformerError(
        f'the model function returned {type(model).__name__}, not a Trax '
        'layer')
  if model.n_in not in (1, 2):
    raise errors.TerraformerError(
        f'cannot decode a model with {model.n_in} inputs: expected 1 '
        '(decoder-only LM) or 2 (encoder-decoder)')


def predict_signature(model, prompt_len=16, batch=1):
  """Input signature of a predict-mode call: one token (and the inputs)."""
  token = shapes.ShapeDtype((batch, 1), np.int32)
  if is_encoder_decoder(model):
    return (shapes.ShapeDtype((batch, prompt_len), np.int32), token)
  return token


def init_shapes(model, signature):
  """(weights, state) of `model.init(signature)` as ShapeDtypeStruct trees.

  Traced on a copy: `model` is untouched and no weight is computed.
  """
  scratch = copy.deepcopy(model)
  return jax.eval_shape(
      lambda: scratch.init(signature, rng=jax.random.PRNGKey(0)))


def zero_state(state_shapes):
  """Fresh predict-mode state from its shapes: empty caches are all zeros.

  Every predict-mode state of Trax and of this project starts at zeros
  (key/value caches, convolution buffers, position counters, tl.Cache's
  empty slot); tests/test_decode_step.py checks it against `model.init`.
  """
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype),
                                state_shapes)
