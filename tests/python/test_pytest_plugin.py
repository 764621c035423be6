"""The pytest plugin stays out of the way of test suites that do not use it: pytest loads it in
every session of the environment (the ``pytest11`` entry point), so loading it must import
neither torch nor torch_brickdev; the ``brick_profile`` fixture imports them where a test uses
it. Checked in fresh pytest processes that load only this plugin. (The fixture's behaviour is
tested in test_contract.py and test_contract_on_demo.py.)"""

import os

import pytest

from helpers import REPO, child_env, run_python

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

PLUGIN = "pytest_torch_brickdev"


def test_the_entry_point_names_the_plugin_and_the_package_installs_it():
    if tomllib is None:
        pytest.skip("reading pyproject.toml needs tomllib (Python 3.11+)")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)
    assert config["project"]["entry-points"]["pytest11"] == {"torch_brickdev": PLUGIN}
    assert PLUGIN in config["tool"]["setuptools"]["py-modules"]


def _pytest(folder, test_file: str):
    """A pytest session in ``folder`` with the plugin and no other (the installed entry point
    may name another version of it)."""
    return run_python("-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN, test_file,
                      cwd=folder, env=child_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"), timeout=300)


def test_loading_the_plugin_imports_neither_torch_nor_torch_brickdev(tmp_path):
    (tmp_path / "test_unrelated.py").write_text(
        "import sys\n"
        "def test_unrelated(pytestconfig):\n"
        f"    assert pytestconfig.pluginmanager.has_plugin({PLUGIN!r})\n"
        "    imported = [m for m in ('torch', 'torch_brickdev') if m in sys.modules]\n"
        "    assert not imported, imported\n")
    out = _pytest(tmp_path, "test_unrelated.py")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout


def test_the_fixture_works_where_a_test_uses_it(tmp_path):
    (tmp_path / "test_uses_it.py").write_text(
        "import sys\n"
        "def test_uses_it(brick_profile):\n"
        "    assert 'torch_brickdev' in sys.modules\n"
        "    import torch\n"
        "    x = torch.ones(4, device='brick')\n"
        "    with brick_profile.profile(sync_mode='event'):\n"
        "        x + 1\n"
        "    assert brick_profile.report.brick('aten::add').count == 1\n")
    out = _pytest(tmp_path, "test_uses_it.py")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout
