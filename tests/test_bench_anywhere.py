"""`mlx-spec bench` as it is installed and called elsewhere: not editable, into a fresh venv whose
`bin/mlx-spec` is called by its path with a PATH that does not hold that `bin/` (as pipx and an
IDE's run button call it). The group table must find MLX's launcher beside itself, and `bench
all` must draw its report from whatever finished when a table fails, is skipped or is stopped."""

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serving import WITHOUT_TORCH
from test_bench import assert_shown, report_rows

REPO = Path(__file__).resolve().parent.parent
# A PATH without any Python environment's bin/ (where mlx.launch would be found).
BARE_PATH = "/usr/bin:/bin"
# The tables `all` leaves out here, for time: positions runs before the group table and is the
# table whose figures must survive the group's failure.
ONLY_POSITIONS_AND_GROUP = "acceptance,draft-length,controlled,overhead,media,batch,rollback,structured"


def fresh_install(root: Path) -> Path:
    """A venv over this machine's packages with mlx itself, and this checkout (not editable),
    installed into it: mlx's launcher is in the venv's bin/ alone. Returns that bin/."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(root / "venv")], check=True)
    source = shutil.copytree(REPO, root / "source", ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    mlx = [f"{name}=={importlib.metadata.version(name)}" for name in ("mlx", "mlx-cpu", "mlx-metal")
           if _installed(name)]
    pip = [str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps"]
    for step in (pip + ["--ignore-installed", *mlx], pip + [str(source)]):
        done = subprocess.run(step, capture_output=True, text=True, timeout=600)
        if done.returncode:
            pytest.skip(f"pip could not install into a fresh venv ({' '.join(step[5:])}): {done.stderr[-500:]}")
    return root / "venv" / "bin"


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def by_path(bin_dir: Path, *args, cwd: Path, **popen):
    """bin/mlx-spec called by its path, with the bare PATH and nothing of this checkout on the
    Python path (torch hidden, as on a Mac: tests/without_torch)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=BARE_PATH, PYTHONPATH=WITHOUT_TORCH)
    return subprocess.Popen([str(bin_dir / "mlx-spec"), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def finished(proc, timeout=600):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def launcher_that(bin_dir: Path, script: str) -> None:
    """Replace the venv's mlx.launch by a shell script (a broken or hanging launcher)."""
    launcher = bin_dir / "mlx.launch"
    launcher.unlink(missing_ok=True)
    launcher.write_text(f"#!/bin/sh\n{script}\n")
    launcher.chmod(0o755)


@pytest.fixture
def tiny_models(checkpoints):
    return ["--model", str(checkpoints["text"]), "--drafter", str(checkpoints["assistant"])]


def test_the_group_table_finds_the_launcher_beside_the_interpreter(tiny_models, tmp_path):
    """The target split over 2 processes of the ring backend (the real mlx.launch, found in the
    venv's bin/, not on the PATH): every run gives the tokens it gives alone, the all-reduces per
    cycle are at least the pass's two per layer, and the report shows the JSON's figures and the
    31B's predicted rows."""
    assert shutil.which("mlx.launch", path=BARE_PATH) is None, "the bare PATH must not hold a launcher"
    bin_dir = fresh_install(tmp_path)
    out = tmp_path / "results"
    status, stdout, err = finished(by_path(bin_dir, "bench", "group", *tiny_models, "--rounds", "1",
                                           "--prompt-tokens", "24", "--max-tokens", "12", "--out", str(out),
                                           cwd=tmp_path))
    assert status == 0, err[-2000:]
    assert "| " in stdout and "Machine:" in stdout
    data = json.loads((out / "group.json").read_text())
    runs = data["runs"]
    assert [r["run"] for r in runs] == ["MTP off", "g = 3", "adaptive"]
    layers = 10  # the tiny target's (tests/tiny.py): attention and MLP each end in an all-reduce
    for r in runs:
        assert r["same_tokens"] and r["alone_tps"] > 0 and r["split_tps"] > 0
        assert 2 * layers <= r["all_reduces_per_cycle"] < 2 * layers + 5
        assert r["bytes_sent_per_token_per_rank"] > 0
    assert_shown(report_rows(out, "group", "same tokens"), runs, {
        "run": lambda r: r["run"], "alone tok/s": lambda r: f"{r['alone_tps']:.1f}",
        "all-reduces per cycle": lambda r: f"{r['all_reduces_per_cycle']:.1f}"})
    predicted = data["predicted_31b"]
    assert {r["ranks"] for r in predicted} == {1, 2, 4}
    assert all(r["mtp"][-1]["tps"] > r["mtp_off_tps"] for r in predicted)  # drafting pays at a = 0.7


def test_all_draws_its_report_from_what_finished(tiny_models, tmp_path):
    """`bench all` with the group table failing (a broken launcher), then skipped (no launcher at
    all), then stopped by Ctrl-C (a launcher that hangs): each time the positions table's figures
    are drawn in the report, the group table is named there with its reason, and the exit status
    says what happened (1 naming the failed table; 0 for a skip; 130 for Ctrl-C)."""
    bin_dir = fresh_install(tmp_path)
    args = ["bench", "all", *tiny_models, "--quick", "--skip", ONLY_POSITIONS_AND_GROUP]

    launcher_that(bin_dir, 'echo "launcher broken on purpose" >&2; exit 3')
    out = tmp_path / "failed"
    status, stdout, err = finished(by_path(bin_dir, *args, "--out", str(out), cwd=tmp_path))
    assert status == 1, err[-2000:]
    assert "mlx-spec bench all: 1 of 2 tables failed (the report holds the others): group:" in err
    assert "launcher broken on purpose" in err
    assert_positions_drawn(out, "Not in this run: failed: the group run printed no result")
    assert "group: failed: the group run printed no result" in stdout  # the block to paste

    (bin_dir / "mlx.launch").unlink()
    out = tmp_path / "skipped"
    status, stdout, err = finished(by_path(bin_dir, *args, "--out", str(out), cwd=tmp_path))
    assert status == 0, err[-2000:]
    where = f"found it in none of {bin_dir / 'mlx.launch'}, the PATH; it comes with mlx: pip install mlx"
    assert_positions_drawn(out, f"Not in this run: skipped: the group table needs MLX's launcher, mlx.launch, and {where}")
    assert "group: skipped: the group table needs MLX's launcher" in stdout

    launcher_that(bin_dir, "sleep 120")
    out = tmp_path / "stopped"
    proc = by_path(bin_dir, *args, "--out", str(out), cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (out / "positions.md").exists():  # the group table starts right after it
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group, the launcher too
    status, stdout, err = finished(proc, timeout=120)
    assert status == 130, err[-2000:]
    assert_positions_drawn(out, "Not in this run: stopped: Ctrl-C while it ran")


def assert_positions_drawn(folder: Path, said_of_group: str) -> None:
    page = (folder / "report.html").read_text()
    assert json.loads((folder / "positions.json").read_text())["target"]
    assert report_rows(folder, "positions", "ms"), "the positions table is not drawn"
    assert "<h2>group</h2>" in page and said_of_group in page.replace("&#x27;", "'")
    assert not (folder / "group.json").exists()
