"""Times the decoding step's output-layer product: dense vs sparse loss.

The dense output layer is one [1, d] x [d, V] product; the sparse loss
(SparseLogits, S modules of M = V / S) is one [S, d] x [d, M] product: S times
fewer weight bytes, the same d x V multiply-adds. Prints the median time of
each (jitted, as the decode step runs it; timed by the benchmarks' timer,
`terraformer.benchmarks.decode_speed.call_seconds`) and the rate in GB/s of
weights read and in multiply-adds per second (docs/decoding-speed.md: why the
sparse loss does not speed up the 17B step outside the decoder blocks on a
CPU).

  .venv/bin/python experiments/decode_output_layer.py [--d=9216] [--vocab=32100] [--s=4]
      [--json=PATH]

--json writes the rows as a table ({"columns", "rows"}, the cells as
printed): `bash experiments/decode_output_layer.sh` records it.
"""
import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from terraformer.benchmarks import decode_speed


def median_ms(fn, *args, repeats=7):
  """The median ms of `fn(*args)`, timed by the benchmarks' timer."""
  return 1e3 * float(np.median(decode_speed.call_seconds(fn, args, repeats)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--d', type=int, default=9216)
  parser.add_argument('--vocab', type=int, default=32100)
  parser.add_argument('--s', type=int, default=4)
  parser.add_argument('--json', help='also write the rows to this file')
  args = parser.parse_args()
  d, s = args.d, args.s
  m = -(-args.vocab // s)
  rng = np.random.default_rng(0)
  dot = jax.jit(lambda x, w: x @ w)
  table = []
  for name, rows, cols in ((f'dense [1,{d}] x [{d},{args.vocab}]', 1,
                            args.vocab),
                           (f'sparse loss [{s},{d}] x [{d},{m}]', s, m)):
    w = jnp.asarray(rng.standard_normal((d, cols), dtype=np.float32))
    x = jnp.asarray(rng.standard_normal((rows, d), dtype=np.float32))
    ms = median_ms(dot, x, w)
    macs = rows * d * cols / 1e6
    table.append([name, f'{ms:.1f}', f'{w.nbytes / 1e6:.0f}',
                  f'{w.nbytes / 1e6 / ms:.1f}', f'{macs:.0f}M',
                  f'{macs / ms:.2f}'])
    print(f'{name:36s} {ms:8.1f} ms  {w.nbytes / 1e6:6.0f} MB '
          f'({w.nbytes / 1e6 / ms:5.1f} GB/s)  {macs:5.0f}M '
          f'multiply-adds ({macs / ms:5.2f} G/s)')
    del w
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'columns': ['product', 'ms', 'MB of weights', 'GB/s',
                             'multiply-adds', 'G multiply-adds/s'],
                 'rows': table}, f)


if __name__ == '__main__':
  main()
