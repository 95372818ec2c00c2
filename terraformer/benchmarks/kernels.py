"""Kernel vs XLA timings of the layers the decode kernels replace.

  python -m terraformer.benchmarks.kernels [--repeats=21] [--cases=800m_loss,...]
      [--json=PATH]

Each layer of the 800M / 17B shapes, random weights, one token: XLA's
predict-mode code (float32) and the kernel layer with float32, bfloat16,
int8 and q8 weights (q8: int8 activations too, the Q8 GEMV; the sparse FF
block reads it as int8), called in turn (interleaved, so they share the
machine's noise); min and median ms over the repeats, and the weight bytes
a call reads over the GEMV bandwidth measured in the same process (x bound).
Last it prints the table of the layers (`layers_table`: a row per layer,
each variant's median ms with its x bound, the MB each reads, the last
variant against XLA) and the table of the compute-bound products
(`products_table`: the Q8 product alone, on one thread, on every Q8 path
this CPU has, against the peak multiply-add rate of that path's int8
instruction, `kernels.peak_macs`); --json writes the rows and the machine
(`decode_speed.machine`) too, and those tables under "tables" (layers,
products: {"columns", "rows"}).
"""
import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from trax import layers as tl
from trax import shapes

from terraformer.benchmarks import bytes_read
from terraformer.benchmarks import decode_speed
from terraformer import kernels
from terraformer.kernels import installer as kernel_installer
from terraformer.kernels import layers as kernel_layers
from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.sparse_ff import SparseFF

# name: (layer factory, d_model); the shapes of gin/scaling_800m and
# gin/bench/17b_*.gin (loss sparsity S = 4 over vocab 32100; FF N = 64; the
# dense models' one-row products: the 800M FF's first layer, a 17B
# attention projection; sparse QKV's multiplicative layer, S = 64 modules of
# 144, compute-bound: S d M multiply-adds).
CASES = {
    '800m_loss': (lambda: MultiplicativeDense(4, 8025, use_bias=True), 1024),
    '800m_ff': (lambda: SparseFF(6144, 64, 64, mode='predict'), 1024),
    '800m_dense_ff': (lambda: tl.Dense(4096), 1024),
    '17b_loss': (lambda: MultiplicativeDense(4, 8025, use_bias=True), 9216),
    '17b_dense_qkv': (lambda: tl.Dense(9216), 9216),
    '17b_qkv_mult': (lambda: MultiplicativeDense(64, 144, use_bias=True),
                     9216),
}
# Compute-bound Q8 products (each weight reused by many rows): rows, K, N.
# The 17B sparse QKV's multiplicative layer, S = 64 modules of 144.
PRODUCTS = {'17b_qkv_mult': (64, 9216, 144)}
VARIANTS = (('xla f32', None), ('ffi f32', 'float32'),
            ('ffi bf16', 'bfloat16'), ('ffi int8', 'int8'), ('ffi q8', 'q8'))


def _calls(make, x):
  """{variant: (call, bytes of weights read)}."""
  calls = {}
  for name, storage in VARIANTS:
    layer = make()
    weights, state = layer.init(shapes.signature(x),
                                rng=jax.random.PRNGKey(0))
    if storage is not None:
      kernel_installer.install(layer)
      weights = kernel_layers.store_weights(layer, weights, storage)
    n_bytes = sum(bytes_read.step_bytes(layer, weights, state, 0).values())
    fn = jax.jit(layer.pure_fn)
    calls[name] = ((lambda f=fn, w=weights, s=state:
                    f(x, w, s, jax.random.PRNGKey(0))[0]), n_bytes)
  return calls


def _time(calls, repeats):
  for call, _ in calls.values():
    jax.block_until_ready(call())
  times = {k: [] for k in calls}
  for _ in range(repeats):
    for k, (call, _) in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(call())
      times[k].append(1e3 * (time.perf_counter() - start))
  return times


def layers_table(rows):
  """The rows as a table: a row per layer (case), the median ms of each
  variant with its x bound, the MB each reads, and the last variant
  against the first (XLA)."""
  variants = list(dict.fromkeys(r['variant'] for r in rows))
  cases = list(dict.fromkeys(r['case'] for r in rows))
  cell = {(r['case'], r['variant']): r for r in rows}
  table = []
  for case in cases:
    got = [cell[case, v] for v in variants]
    table.append([case]
                 + [f"{r['median_ms']:.2f} ({r['x_bound']:.2f})" for r in got]
                 + [' / '.join(f"{r['bytes'] / 1e6:.1f}" for r in got),
                    f"{got[-1]['vs_xla']:.2f}x"])
  return {'columns': (['layer'] + [f'{v} ms (x bound)' for v in variants]
                      + [f'MB read ({" / ".join(variants)})',
                         f'{variants[-1]} vs {variants[0]}']),
          'rows': table}


def time_products(products, repeats):
  """Rows of `products_table`: each product (rows, K, N) on each Q8 path
  this CPU has (not the emulated ones), the product alone on one thread
  (`kernels.q8_product_macs`, the median of `repeats` calls) and its path's
  int8 peak (`kernels.peak_macs`), measured one after the other."""
  rows = []
  in_use = kernels.gemv_isa()
  try:
    for name in kernels.GEMV_ISA_NAMES:
      if name in kernels.GEMV_EMULATED or kernels.set_gemv_isa(name) != name:
        continue  # A test path, or one this CPU lacks.
      peak = kernels.peak_macs('int8')
      for product, shape in products.items():
        rate = kernels.q8_product_macs(*shape, repeats=repeats)
        rows.append({'product': product, 'shape': list(shape), 'path': name,
                     'macs_per_s': rate, 'peak_macs_per_s': peak,
                     'of_peak': rate / peak})
  finally:
    kernels.set_gemv_isa(in_use)
  return rows


def products_table(rows):
  """A row per product and path: its multiply-add rate, the path's peak and
  the share of it."""
  return {'columns': ['product', 'rows x K x N', 'path', 'G MAC/s',
                      'peak G MAC/s', '% of peak'],
          'rows': [[r['product'], ' x '.join(map(str, r['shape'])), r['path'],
                    f"{r['macs_per_s'] / 1e9:.0f}",
                    f"{r['peak_macs_per_s'] / 1e9:.0f}",
                    f"{100 * r['of_peak']:.0f}"] for r in rows]}


def _print_table(table):
  for line in [table['columns'], ['---'] * len(table['columns'])] + (
      table['rows']):
    print('| ' + ' | '.join(line) + ' |')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repeats', type=int, default=21)
  parser.add_argument('--cases', default=','.join(CASES))
  parser.add_argument('--json', help='also write the rows to this file')
  args = parser.parse_args(argv)
  if not kernels.available():
    raise SystemExit(f'kernels not available: {kernels.unavailable_reason()}')
  gbps, _ = decode_speed.gemv_bandwidth()
  print(f'kernels: {kernels.set_isa()}, q8 GEMV {kernels.gemv_isa()}; GEMV '
        f'{gbps:.1f} GB/s (median)')
  rows = []
  for case in args.cases.split(','):
    make, d = CASES[case]
    x = jnp.full((1, 1, d), 0.1, jnp.float32)
    calls = _calls(make, x)
    times = _time(calls, args.repeats)
    base = np.median(times['xla f32'])
    for k, t in times.items():
      n_bytes = calls[k][1]
      bound = 1e3 * n_bytes / (gbps * 1e9)
      median = float(np.median(t))
      rows.append({'case': case, 'variant': k, 'min_ms': min(t),
                   'median_ms': median, 'bytes': int(n_bytes),
                   'x_bound': median / bound, 'vs_xla': float(base / median)})
      print(f'{case:<10} {k:<9} min {min(t):8.2f}  median {median:8.2f}'
            f' ms  {n_bytes / 1e6:7.1f} MB  x bound {median / bound:5.2f}'
            f'  vs xla {base / median:5.2f}x', flush=True)
  products = time_products(PRODUCTS, args.repeats)
  for r in products:
    print(f"{r['product']:<12} {r['path']:<10} product alone, 1 thread: "
          f"{r['macs_per_s'] / 1e9:6.0f} G MAC/s, {100 * r['of_peak']:3.0f}% "
          f"of the path's int8 peak {r['peak_macs_per_s'] / 1e9:.0f}",
          flush=True)
  table = layers_table(rows)
  _print_table(table)
  product_table = products_table(products)
  _print_table(product_table)
  if args.json:
    with open(args.json, 'w', encoding='utf-8') as f:
      json.dump({'repeats': args.repeats, 'bandwidth_gbps': gbps,
                 'machine': decode_speed.machine(), 'rows': rows,
                 'products': products,
                 'tables': {'layers': table, 'products': product_table}},
                f, indent=2)


if __name__ == '__main__':
  main()
