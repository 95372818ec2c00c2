"""Time and quality of soft top-k operators vs n and k (Pietruszka et al. B.5).

Setup of App. B.5 (Figs. 5, 6): E_ij ~ U[-1, 1], v_i ~ U[0, 1], a batch of
16, n = 2^6 ... 2^14, k ∈ {8, 32, 128, 512, 2048}, k < n. Quality is the
normalized Chamfer cosine similarity to the exact top-k,
  nCCS = (1/k) Σ_i max_j cos(y_i, ŷ_j),
time the median wall time of the jitted operator over repeats (after one
compile-and-run warm-up). The paper gives no d; 64 here.

Methods:
  sh           Successive Halving Top-k, sorted, peaked softmax (the paper's
               operator as the authors run it);
  sh_unsorted  the same without the SORT step (App. B.2, B.5 "w/o sorting");
  sh_plain     sorted, with the plain pair softmax of App. B.3 eq. 6;
  goyal        iterative soft top-k (Goyal et al. 2018 as App. B describes
               it): k softmaxes over the n scores, each output the expectation
               of E under one, the argmax masked for the next; O(nk), so run
               only where n·k <= goyal_max;
  hard         exact top-k (`jax.lax.top_k` + gather): the time floor.
"""
import statistics
import time

import numpy as np

METHODS = ('sh', 'sh_unsorted', 'sh_plain', 'goyal', 'hard')
PAPER_NS = tuple(2 ** i for i in range(6, 15))
PAPER_KS = (8, 32, 128, 512, 2048)


def nccs(true, approx):
  """Normalized Chamfer cosine similarity (App. B.5), batch mean."""
  true = true / np.maximum(np.linalg.norm(true, axis=-1, keepdims=True),
                           1e-12)
  approx = approx / np.maximum(np.linalg.norm(approx, axis=-1, keepdims=True),
                               1e-12)
  return float(np.mean(np.max(np.einsum('bid,bjd->bij', true, approx),
                              axis=-1)))


def _operator(method, k):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from terraformer.layers import successive_halving_topk as sh  # pylint: disable=g-import-not-at-top

  if method in ('sh', 'sh_unsorted', 'sh_plain'):
    def fn(vectors, scores):
      return sh.successive_halving_topk(
          vectors, scores, k, peaked=method != 'sh_plain',
          sort=method != 'sh_unsorted')[0]
  elif method == 'hard':
    def fn(vectors, scores):
      return sh.hard_topk(vectors, scores, k)
  elif method == 'goyal':
    def fn(vectors, scores):
      def step(masked, _):
        weights = jax.nn.softmax(masked, axis=-1)
        out = jnp.einsum('bn,bnd->bd', weights, vectors)
        taken = jax.nn.one_hot(jnp.argmax(masked, axis=-1), masked.shape[1],
                               dtype=bool)
        return jnp.where(taken, -jnp.inf, masked), out
      _, outs = jax.lax.scan(step, scores, None, length=k)
      return jnp.swapaxes(outs, 0, 1)
  else:
    raise ValueError(f'unknown method {method!r}; one of {METHODS}')
  return jax.jit(fn)


def measure(n, k, method, batch=16, d=64, repeats=5, seed=0):
  """dict(ms=median ms, nccs=similarity to the exact top-k)."""
  import jax  # pylint: disable=g-import-not-at-top
  from terraformer.layers import successive_halving_topk as sh  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  vectors = jax.device_put(
      rng.uniform(-1, 1, (batch, n, d)).astype(np.float32))
  scores = jax.device_put(rng.uniform(0, 1, (batch, n)).astype(np.float32))
  fn = _operator(method, k)
  out = np.asarray(jax.block_until_ready(fn(vectors, scores)))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(vectors, scores))
    times.append(1e3 * (time.perf_counter() - start))
  true = np.asarray(sh.hard_topk(vectors, scores, k))
  return {'ms': statistics.median(times), 'nccs': nccs(true, out)}


def run(ns=PAPER_NS, ks=PAPER_KS, methods=METHODS, batch=16, d=64,
        repeats=5, goyal_max=2 ** 20, log=None):
  """Rows {n, k, <method>: {ms, nccs} or None (skipped)} for k < n."""
  rows = []
  for k in ks:
    for n in ns:
      if k >= n:
        continue
      row = {'n': n, 'k': k}
      for method in methods:
        if method == 'goyal' and n * k > goyal_max:
          row[method] = None
          continue
        row[method] = measure(n, k, method, batch, d, repeats)
      rows.append(row)
      if log:
        log(' '.join([f'n={n} k={k}'] + [
            f"{m}={'-' if row[m] is None else '%.3fms/%.3f' % (row[m]['ms'], row[m]['nccs'])}"
            for m in methods]))
  return {'batch': batch, 'd': d, 'repeats': repeats, 'methods': list(methods),
          'rows': rows}
