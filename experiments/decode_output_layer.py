"""Times the decoding step's output-layer product: dense vs sparse loss.

The dense output layer is one [1, d] x [d, V] product; the sparse loss
(SparseLogits, S modules of M = V / S) is one [S, d] x [d, M] product: S times
fewer weight bytes, the same d x V multiply-adds. Prints the median time of
each (jitted, as the decode step runs it) and the rate in GB/s of weights
read and in multiply-adds per second (docs/decoding-speed.md: why the sparse
loss does not speed up the 17B step outside the decoder blocks on a CPU).

  .venv/bin/python experiments/decode_output_layer.py [--d=9216] [--vocab=32100] [--s=4]

Cost: seconds (17B dimensions by default); needs a quiet machine. It writes
no JSON: results/decode_output_layer.json (table dot) is transcribed from
its output.
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np


def median_ms(fn, *args, repeats=7):
  fn(*args).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn(*args).block_until_ready()
    times.append(time.perf_counter() - start)
  return 1e3 * float(np.median(times))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--d', type=int, default=9216)
  parser.add_argument('--vocab', type=int, default=32100)
  parser.add_argument('--s', type=int, default=4)
  args = parser.parse_args()
  d, s = args.d, args.s
  m = -(-args.vocab // s)
  rng = np.random.default_rng(0)
  dot = jax.jit(lambda x, w: x @ w)
  for name, rows, cols in (('dense [1,d]x[d,V]', 1, args.vocab),
                           (f'sparse loss [{s},d]x[d,{m}]', s, m)):
    w = jnp.asarray(rng.standard_normal((d, cols), dtype=np.float32))
    x = jnp.asarray(rng.standard_normal((rows, d), dtype=np.float32))
    ms = median_ms(dot, x, w)
    print(f'{name:28s} {ms:8.1f} ms  {w.nbytes / 1e6:6.0f} MB '
          f'({w.nbytes / 1e6 / ms:5.1f} GB/s)  {rows * d * cols / 1e6:5.0f}M '
          f'multiply-adds ({rows * d * cols / 1e6 / ms:5.2f} G/s)')
    del w


if __name__ == '__main__':
  main()
