"""The frontier plot's words: what tells the configurations of one method
apart beside their points and in the legend (`variant_words`,
`point_words`), the title's privacy line (`privacy_words`: epsilon, its
accountant, delta and the sampling) and which statistic the y axis shows
(`statistic`, with its footnote).
"""

import re
from typing import Sequence

from tff_dp.reporting import frontier
from tff_dp.reporting import wording


# Flags that tell a method's configurations apart on a plot, in words.
_FLAG_WORDS = {
  'cmp_rank': lambda v: f'rank {v}',
  'randagg_fraction': lambda v: f'k/d {100 * float(v):.2g}%',
  'lus_sparsity': lambda v: f'sparsity {v}',
  'blur_lambda': lambda v: f'λ {v}',
  'top_k_ratio': lambda v: f'r {100 * float(v):g}%',
  'clip': lambda v: f'clip {v}',
  'server_lr': lambda v: f'server lr {v}',
  'clip_from_public_round': lambda v: 'S from a public round'
  if v == 'True'
  else '',
  'top_k_nonprivate_clip': lambda v: 'K values clipped' if v == 'True' else '',
  'cmp_dense_below': lambda v: f'dense below {int(v):,} params',
  'dpsfl_bit_noise': lambda v: f'bit noise {v}',
  'dpsfl_impact_threshold': lambda v: f'γ {v}',
  'rounds': lambda v: f'{v} rounds',
}
# Flags that never tell configurations apart (seeds, paths, bookkeeping).
_NOT_A_VARIANT = frozenset(
  (
    'seed',
    'noise_seed',
    'root_output_dir',
    'output_dir',
    'eval_every',
    'release_non_private_metrics',
    'allow_noise_seed_reuse',
    'method',
    'noise',
    'clip_source',
    # The sampling: `point_words` says it where it is not the plot's.
    'client_sampling_rate',
    'clients_per_round',
    'participation',
    'participation_groups',
  )
)


def variant_words(groups: Sequence[frontier.FrontierGroup]) -> dict[str, str]:
  """Short words that tell apart the configurations of one method: the
  flags whose values differ among them, read by `_FLAG_WORDS` (a flag a
  row does not set is left out of its words; a clip is left out where a
  public round replaced it; sampling flags are `point_words`')."""
  if len(groups) < 2:
    return {g.name: '' for g in groups}
  keys = set().union(*(g.flags for g in groups)) - _NOT_A_VARIANT
  order = list(_FLAG_WORDS)
  differing = sorted(
    (k for k in keys if len({g.flags.get(k) for g in groups}) > 1),
    key=lambda k: (order.index(k) if k in order else len(order), k),
  )
  words = {}
  for g in groups:
    parts = []
    for k in differing:
      v = g.flags.get(k)
      if v is None or (
        k == 'clip' and g.flags.get('clip_from_public_round') == 'True'
      ):
        continue
      text = _FLAG_WORDS[k](v) if k in _FLAG_WORDS else f'{k} {v}'
      if text:
        parts.append(text)
    words[g.name] = ', '.join(parts)
  return words


_ROUNDS_LABEL = re.compile(r'\s*\(\d+ rounds\)')


def _common_word_prefix(labels: Sequence[str]) -> str:
  prefix = labels[0]
  for label in labels[1:]:
    while not label.startswith(prefix):
      prefix = prefix[:-1]
  # Back to a word boundary.
  cut = max(prefix.rfind(' '), prefix.rfind(','), prefix.rfind(':'))
  return prefix if prefix in labels else prefix[: cut + 1]


def _shorten(text: str, n: int = 56) -> str:
  return text if len(text) <= n else text[: n - 1].rstrip(' ,') + '…'


def _range_words(values: Sequence[float], digits: int = 3) -> str:
  lo, hi = min(values), max(values)
  if hi <= lo * 1.005:
    return f'{lo:.{digits}g}'
  return f'{lo:.{digits}g}–{hi:.{digits}g}'


def privacy_words(groups: Sequence[frontier.FrontierGroup]) -> str:
  """The title's privacy line: epsilon and its accountant (with the PLD
  reading), delta and the sampling, over the private groups.

  Raises:
    ValueError: If the private groups' RDP epsilons differ by more than
      1% (a frontier compares methods at one epsilon).
  """
  private = [g for g in groups if g.private]
  if not private:
    return f'no DP, {_common_sampling(groups)}'
  eps = sorted(g.epsilon for g in private)
  if eps[-1] > 1.01 * eps[0]:
    raise ValueError(
      f'the private points have epsilons {eps[0]:.4g} to {eps[-1]:.4g}: a '
      'frontier compares methods at one epsilon (within 1%)'
    )
  accountants = sorted(
    {str(g.flags.get('accountant') or 'rdp').upper() for g in private}
  )
  pld = [
    g.epsilon_pld for g in private if g.epsilon_pld is not None and not g.caveat
  ]
  pld_words = f'; PLD: {_range_words(pld, 2)}' if pld else ''
  deltas = sorted(
    {wording.number(g.flags.get('delta')) for g in private} - {None}
  )
  delta_words = (
    'δ = ' + ', '.join(wording.format_probability(d) for d in deltas)
    if deltas
    else 'δ not recorded'
  )
  return (
    f'ε = {eps[0]:.2f} ({"/".join(accountants)} accountant{pld_words}), '
    f'{delta_words}, {_common_sampling(groups)}'
  )


def _majority_sampling(
  groups: Sequence[frontier.FrontierGroup],
) -> tuple[str, bool]:
  """The sampling words most groups share, and whether all share them."""
  words = [wording.sampling_words(g.flags) for g in groups]
  common = max(words, key=words.count)
  return common, words.count(common) == len(words)


def _common_sampling(groups: Sequence[frontier.FrontierGroup]) -> str:
  common, everyone = _majority_sampling(groups)
  return common if everyone else f'{common} (other rows as labelled)'


def point_words(
  groups: Sequence[frontier.FrontierGroup],
) -> tuple[dict[str, str], dict[str, str]]:
  """What the plot writes beside each point, and after each method's name
  in the legend.

  Beside a point: its `variant_words`, and its sampling where that is not
  the plot's; a configuration whose words are still empty or another's
  gets its row label less the part its method's labels share. In the
  legend: a sampling all of a method's configurations share that is not
  the plot's, and the method's epsilon caveat.
  """
  common, _ = _majority_sampling(groups)
  methods = list(dict.fromkeys(g.method for g in groups))
  words, legend = {}, {}
  for m in methods:
    members = [g for g in groups if g.method == m]
    own = variant_words(members)
    extra = [
      ''
      if wording.sampling_words(g.flags) == common
      else wording.sampling_words(g.flags)
      for g in members
    ]
    in_legend = []
    if extra[0] and all(e == extra[0] for e in extra):
      in_legend.append(extra[0])
    else:
      for g, e in zip(members, extra):
        own[g.name] = ', '.join(filter(None, [own[g.name], e]))
    if len(members) > 1:
      texts = list(own.values())
      prefix = _common_word_prefix([g.label for g in members])
      for g in members:
        if not own[g.name] or texts.count(own[g.name]) > 1:
          own[g.name] = _label_rest(g.label, prefix) or own[g.name]
    words.update(own)
    if members[0].caveat:
      in_legend.append(members[0].caveat)
    legend[m] = ', '.join(in_legend)
  return words, legend


def _label_rest(label: str, prefix: str) -> str:
  """A row label less `prefix` and its round count, shortened."""
  rest = _ROUNDS_LABEL.sub('', label[len(prefix) :]).strip(' ,:')
  if rest.startswith('(') and rest.endswith(')'):
    rest = rest[1:-1]
  return _shorten(rest)


def statistic(points: Sequence[frontier.FrontierPoint]) -> tuple[str, str, str]:
  """('last_three' or 'final', the y axis's words, the footnote's)."""
  have = sum(p.last_three is not None for p in points)
  rounds = sorted({p.rounds for p in points if p.rounds})
  at = f' (round {rounds[0]})' if len(rounds) == 1 else ''
  if have == len(points):
    return (
      'last_three',
      'mean of the last 3 evaluations',
      'y: the mean of the last 3 evaluations of each run'
      f'{at and " up to" + at}, averaged over seeds.',
    )
  return (
    'final',
    'at the last evaluation',
    f'y: the test metric at the last evaluation{at}, averaged over seeds '
    f'(the mean of the last 3 needs per-round files, committed for {have} '
    f'of {len(points)} runs here, so no point uses it). Not the best round.',
  )
