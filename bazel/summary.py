"""Sums the JUnit XML of every Bazel test into one line.

Usage: python bazel/summary.py bazel-testlogs

Prints each test file's counts and then "N passed, N failed, N skipped"
(failures and errors count as failed). Exits 1 when no test ran or any
failed.
"""

import pathlib
import sys
import xml.etree.ElementTree as ET


def main(root: str) -> int:
  passed = failed = skipped = 0
  for xml in sorted(pathlib.Path(root).rglob('test.xml')):
    tree = ET.parse(xml).getroot()
    suites = [tree] if tree.tag == 'testsuite' else tree.iter('testsuite')
    for suite in suites:
      tests = int(suite.get('tests', 0))
      bad = int(suite.get('failures', 0)) + int(suite.get('errors', 0))
      skip = int(suite.get('skipped', 0))
      passed += tests - bad - skip
      failed += bad
      skipped += skip
      print(f'{xml.parent.relative_to(root)}: {tests} tests, {bad} failed')
  print(f'{passed} passed, {failed} failed, {skipped} skipped')
  return 0 if passed and not failed else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else 'bazel-testlogs'))
