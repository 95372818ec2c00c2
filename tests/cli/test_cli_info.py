"""terraformer-info: parameter counts by layer kind, table or JSON."""
import json
import os
import subprocess
import sys

import tiny_lm
from terraformer.cli import info as info_cli

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(capsys, *args):
  code = info_cli.main(['terraformer-info', *args])
  out, err = capsys.readouterr()
  return code, out, err


def test_json_matches_hand_count(tmp_path, capsys):
  code, out, _ = _run(capsys, '--config_file=' + tiny_lm.write_config(tmp_path),
                      '--json')
  assert code == 0
  result = json.loads(out)
  expected = tiny_lm.transformer_lm_params()
  assert result['by_layer'] == expected
  assert result['total'] == sum(expected.values())


def test_bindings_change_the_count(tmp_path, capsys):
  code, out, _ = _run(capsys, '--config_file=' + tiny_lm.write_config(tmp_path),
                      '--config=TransformerLM.n_layers = 3',
                      '--config=TransformerLM.d_ff = 48', '--json')
  assert code == 0
  expected = tiny_lm.transformer_lm_params(n_layers=3, d_ff=48)
  result = json.loads(out)
  tables = result.pop('tables')
  assert result == {'by_layer': expected, 'total': sum(expected.values())}
  # The table the CLI prints: the config and its count.
  assert tables['parameters']['rows'] == [
      [tiny_lm.write_config(tmp_path), info_cli.parameters(
          sum(expected.values()))]]


def test_table(tmp_path, capsys):
  code, out, _ = _run(capsys, '--config_file=' + tiny_lm.write_config(tmp_path))
  assert code == 0
  expected = tiny_lm.transformer_lm_params()
  lines = out.splitlines()
  end = next(i for i, l in enumerate(lines) if l.startswith('total '))
  rows = {line.split()[0]: line.split()[1] for line in lines[1:end + 1]}
  assert rows == {**{k: f'{v:,}' for k, v in expected.items()},
                  'total': f'{sum(expected.values()):,}'}
  # Then the config and its parameters, as the docs write them.
  assert lines[end + 1].split() == ['config', 'parameters']
  assert lines[end + 2].split()[1] == info_cli.parameters(
      sum(expected.values()))


def test_errors(tmp_path, capsys):
  code, _, err = _run(capsys, '--config_file=missing.gin')
  assert code == 2
  assert err == "terraformer-info: error: config file 'missing.gin' not found\n"
  code, _, err = _run(capsys, '--config=TransformerLM.d_model = 8')
  assert code == 2
  assert err.startswith('terraformer-info: error: no model configured')
  assert len(err.splitlines()) == 1


def test_console_script_json(tmp_path):
  exe = os.path.join(os.path.dirname(sys.executable), 'terraformer-info')
  done = subprocess.run(
      [exe, '--config_file=' + tiny_lm.write_config(tmp_path), '--json'],
      env=dict(os.environ, PYTHONPATH=HERE), capture_output=True, text=True,
      timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  expected = tiny_lm.transformer_lm_params()
  assert json.loads(done.stdout)['total'] == sum(expected.values())


def test_devices_split_weights_slots_and_activations(tmp_path, capsys):
  """--devices=N: FSDP bytes per device, from the same shapes as the count."""
  config = '--config_file=' + tiny_lm.write_config(tmp_path)
  plans = {}
  for n in (1, 4):
    code, out, _ = _run(capsys, config, f'--devices={n}', '--batch_size=8',
                        '--length=64', '--json')
    assert code == 0
    result = json.loads(out)
    plans[n] = result['per_device']
    assert result['tables']['plan'] == info_cli.plan_table(
        config[len('--config_file='):], plans[n])
  total = sum(tiny_lm.transformer_lm_params().values())
  assert plans[1]['weights_bytes'] == 4 * total  # float32, every weight.
  assert plans[1]['weights_bytes_per_device'] == 4 * total
  assert plans[1]['slots_bytes_per_device'] == 2 * 4 * total  # Adam: m, v.
  # Split over 4 devices: what is replicated (vectors) stays whole.
  assert (plans[4]['weights_bytes_per_device']
          == (4 * total - plans[4]['replicated_bytes_per_device']) // 4
          + plans[4]['replicated_bytes_per_device'])
  assert plans[4]['weights_bytes_per_device'] < plans[1]['weights_bytes'] / 3
  assert plans[4]['activation_bytes_per_device'] * 4 == (
      plans[1]['activation_bytes_per_device']) > 0
  code, out, _ = _run(capsys, config, '--devices=4', '--device_memory_gb=1e-6')
  assert code == 0 and 'does NOT fit in 1e-06 GiB per device' in out


def test_compiled_fsdp_step_memory_falls_with_devices(tmp_path):
  """--compiled: XLA's analysis of the real FSDP step agrees with the
  shape-only plan (its arguments hold the weight and slot shards) and falls
  with the number of devices."""
  exe = os.path.join(os.path.dirname(sys.executable), 'terraformer-info')
  config = '--config_file=' + tiny_lm.write_config(tmp_path)
  results = {}
  for n in (1, 4):
    done = subprocess.run(
        [exe, config, f'--devices={n}', '--compiled', '--batch_size=8',
         '--length=64', '--json'], env=dict(os.environ, PYTHONPATH=HERE),
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results[n] = json.loads(done.stdout)
  for n, result in results.items():
    plan, compiled = result['per_device'], result['compiled_per_device']
    held = plan['weights_bytes_per_device'] + plan['slots_bytes_per_device']
    batch = 3 * 8 * 64 * 4 // n  # Tokens, targets, weights: 4 bytes each.
    assert held <= compiled['arguments'] <= held + batch + 4096, (n, result)
  one, four = (results[n]['compiled_per_device'] for n in (1, 4))
  assert four['arguments'] < one['arguments'] / 3
  assert four['peak'] < one['peak']
