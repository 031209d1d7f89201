"""scripts/test.sh's pytest step, run_pytest (the script sourced, in a subprocess): a run that
collects no tests fails (pytest's exit status 5, which the script once turned into success), a run
whose tests pass succeeds and one with a failing test fails; and the script ends on that step, for
python_tests, so that its exit status is the script's."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEST_SH = REPO / "scripts" / "test.sh"


def _run_pytest(folder):
    """run_pytest FOLDER in bash, with this interpreter's python first on PATH."""
    env = dict(os.environ, PATH=os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))))
    # $0 is not the script's path: sourced, the script only defines run_pytest.
    return subprocess.run(["bash", "-c", 'source "$1" && run_pytest "$2"', "run_pytest", str(TEST_SH), str(folder)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_a_run_that_collects_no_tests_fails(tmp_path):
    (tmp_path / "helpers.py").write_text("def helper():\n    return 1\n")  # a file, but no test
    run = _run_pytest(tmp_path)
    assert run.returncode == 5, run.stdout + run.stderr
    assert "[test] pytest collected no tests" in run.stderr


@pytest.mark.parametrize("body, status", [("assert True", 0), ("assert False", 1)], ids=["passes", "fails"])
def test_a_run_has_the_status_of_its_tests(tmp_path, body, status):
    (tmp_path / "test_one.py").write_text(f"def test_one():\n    {body}\n")
    run = _run_pytest(tmp_path)
    assert run.returncode == status, run.stdout + run.stderr
    assert "collected no tests" not in run.stderr


def test_the_script_ends_on_the_pytest_step_for_python_tests():
    lines = [line for line in TEST_SH.read_text().splitlines() if line.strip()]
    assert lines[-1] == "run_pytest python_tests"
    assert "exec bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()  # what CI runs
