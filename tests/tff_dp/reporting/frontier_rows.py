"""Rows of a study's results store for the frontier tests: `row` writes
one as the study runner records it, `store` writes a store, and `STUDY` is
a small study (DP-FedAvg over three seeds, FL-TOP-DP, CMP-Fed at two
ranks and FedAvg, some with paper numbers)."""

import json


COMMON = (
  'python -m tff_dp.run --task=t --rounds=30 --client_sampling_rate=0.0166667'
  ' --delta=0.0001 --target_epsilon=1 --seed={seed} --noise_seed={seed}'
)


def row(method, label, kb, final, eps, paper='', seed=0, pld=None, **flags):
  command = COMMON.format(seed=seed) + f' --method={method}'
  command += ''.join(f' --{k}={v}' for k, v in flags.items())
  return {
    'method': label,
    'KB up / client / round': kb,
    'best test metric': final + 0.05,
    'final test metric': final,
    'epsilon RDP': eps,
    'epsilon PLD': pld if pld is not None else (0.8 if eps else None),
    'paper': paper,
    'seed': seed,
    'command': command,
  }


def store(tmp_path, rows):
  path = tmp_path / 'results' / 'study.json'
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(rows))
  return path


STUDY = {
  'dp': row('dp_fedavg', 'DP-FedAvg', 6000.0, 0.70, 1.0, 0.78),
  'dp_seed1': row('dp_fedavg', 'DP-FedAvg, seed 1', 6000.0, 0.60, 1.0, 0.78, 1),
  'dp_seed2': row('dp_fedavg', 'DP-FedAvg, seed 2', 6000.0, 0.65, 1.0, 0.78, 2),
  'top': row('fl_top_dp', 'FL-TOP-DP', 5.0, 0.64, 1.0 + 1e-7),
  'cmp_r1': row('cmp_fed', 'CMP-Fed rank 1', 20.0, 0.50, 1.0, 0.69, cmp_rank=1),
  'cmp_r16': row('cmp_fed', 'CMP-Fed rank 16', 300.0, 0.62, 1.0, cmp_rank=16),
  'fedavg': row('fedavg', 'FedAvg (no DP)', 6000.0, 0.80, None, 0.86),
}
