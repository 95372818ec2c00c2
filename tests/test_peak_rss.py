"""tests/peak_rss.py measures the command's own peak, not the test process's."""
import numpy as np

import peak_rss  # tests/peak_rss.py


def test_small_child_of_a_large_test_process_reports_its_own_peak():
  ballast = np.ones(768 * 2**20 // 8)  # 768 MiB resident in this process
  code, _, _, peak_kib = peak_rss.run_python('pass', timeout=60)
  assert ballast.sum() > 0
  assert code == 0
  assert peak_kib < 200 * 2**10, f'{peak_kib / 2**10:.0f} MiB'


def test_child_allocation_is_counted():
  code, _, _, peak_kib = peak_rss.run_python(
      'import numpy as np; a = np.ones(400 * 2**20 // 8); print(a.sum())',
      timeout=60)
  assert code == 0
  assert peak_kib > 400 * 2**10, f'{peak_kib / 2**10:.0f} MiB'


def test_exit_code_and_timeout():
  code, _, err, _ = peak_rss.run_python(
      'import sys; sys.exit("bad input")', timeout=60)
  assert (code, err.strip()) == (1, 'bad input')
  code, _, _, peak_kib = peak_rss.run_python(
      'import time; time.sleep(60)', timeout=1)
  assert (code, peak_kib) == (-9, None)
