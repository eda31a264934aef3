"""The test command's `--dist loadgroup` keeps each xdist_group in one worker: the timed slow
tests one after another, and a framework's bot built once for all its checks. pytest 9.2 with
pytest-xdist 3.8 silently stopped doing it (every test ran anywhere, the timed ones beside the
heaviest), so a child pytest session proves it with the versions installed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

GROUPED = textwrap.dedent(
    """
    import json, os, pathlib, time
    import pytest

    def record(name):
        pathlib.Path(name).write_text(os.environ["PYTEST_XDIST_WORKER"])
        time.sleep(0.3)  # long enough that an idle worker would take the next one

    @pytest.mark.xdist_group("together")
    @pytest.mark.parametrize("n", range(4))
    def test_grouped(n):
        record(f"grouped-{n}")

    @pytest.mark.parametrize("n", range(4))
    def test_free(n):
        record(f"free-{n}")
    """
)


def test_loadgroup_keeps_a_group_in_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "3", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "-p", "no:randomly", "test_grouped.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {path.name: path.read_text() for path in tmp_path.glob("*-*") if path.is_file()}
    grouped = {workers[f"grouped-{n}"] for n in range(4)}
    assert len(grouped) == 1, json.dumps(workers)
    # The control: without a group the same tests spread over the workers.
    assert len({workers[f"free-{n}"] for n in range(4)} | grouped) > 1, json.dumps(workers)
