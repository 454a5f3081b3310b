"""Sums the JUnit XML of every Bazel test into one line.

Usage: python bazel/summary.py bazel-testlogs [tests [examples]]

Reads the XML of the test files that exist now (`tests/**/*_test.py` and
the user example `bazel/example/*.py`, one Bazel target each): a file with
no XML counts as failed (it did not run), and XML left in bazel-testlogs
by a target since deleted or moved is ignored and named. Prints each test
file's counts and then "N passed, N failed, N skipped" (failures and
errors count as failed). Exits 1 when no test ran or any failed.
"""

import pathlib
import sys
import xml.etree.ElementTree as ET


def main(
  root: str, tests: str = 'tests', examples: str = 'bazel/example'
) -> int:
  logs = pathlib.Path(root)
  targets = {
    path.with_suffix('').as_posix()
    for path in pathlib.Path(tests).rglob('*_test.py')
  } | {
    path.with_suffix('').as_posix()
    for path in pathlib.Path(examples).glob('*.py')
  }
  passed = failed = skipped = 0
  for target in sorted(targets):
    xml = logs / target / 'test.xml'
    if not xml.exists():
      failed += 1
      print(f'{target}: no test.xml (did not run): counted as 1 failed')
      continue
    tree = ET.parse(xml).getroot()
    suites = [tree] if tree.tag == 'testsuite' else tree.iter('testsuite')
    for suite in suites:
      count = int(suite.get('tests', 0))
      bad = int(suite.get('failures', 0)) + int(suite.get('errors', 0))
      skip = int(suite.get('skipped', 0))
      passed += count - bad - skip
      failed += bad
      skipped += skip
      print(f'{target}: {count} tests, {bad} failed')
  for xml in sorted(logs.rglob('test.xml')):
    target = xml.parent.relative_to(logs).as_posix()
    if target not in targets:
      print(f'{target}: stale test.xml (no such test file now): ignored')
  print(f'{passed} passed, {failed} failed, {skipped} skipped')
  return 0 if passed and not failed else 1


if __name__ == '__main__':
  sys.exit(main(*sys.argv[1:4]))
