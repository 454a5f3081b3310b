"""docs/settings.md is what the declarations give (one source per setting)."""

from tff_dp import methods
from tff_dp import settings_doc


def test_the_settings_page_is_current():
  assert (
    settings_doc.PAGE.read_text() == settings_doc.render()
  ), 'docs/settings.md is stale: run python -m tff_dp.settings_doc'


def test_the_page_lists_every_flag_once():
  page = settings_doc.render()
  for name in (
    '--clip',
    '--root_output_dir',
    '--task_option',
    '--clip_fraction',
  ):
    assert page.count(f'| `{name}` |') == 1, name
  for name in methods.option_fields():
    assert page.count(f'| `--{name}` |') == 1, name
  for name in methods.METHODS:
    assert f'- `{name}`: ' in page
