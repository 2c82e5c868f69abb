"""The README followed line by line: its code blocks marked `run:NAME` run as written, against real pools, S3 on moto.

Only what a test cannot use is substituted, each in one named place: the pool's port 7420 (a free one), the S3 endpoint
(moto's) and the bucket (a fresh one). The install steps of the first command are not run: this suite runs in the
environment they make.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from client import PoolClient, UnavailableError
from tests.client_fixtures import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # where pip put clink, clink-pool and python
BLOCK = re.compile(r"^```(\w+) run:([\w-]+)\n(.*?)^```", re.M | re.S)
README_ADDRESS = "127.0.0.1:7420"
README_S3_ENDPOINT = "http://127.0.0.1:9000"
README_BUCKET = "clink-state"
# a block's serve line runs in the background of the block's shell, and the next line waits for the pool to answer
PRELUDE = """set -euo pipefail
pids=()
stop() { for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done; wait || true; }
trap stop EXIT
ready() { python -c 'import sys; from client import PoolClient; PoolClient(sys.argv[1]).wait_ready(30)' "$1"; }
"""


def readme_blocks() -> dict[str, tuple[str, str]]:
    """The README's marked blocks by name: (language, text)."""
    found: dict[str, tuple[str, str]] = {}
    for language, name, text in BLOCK.findall((REPO / "README.md").read_text()):
        assert name not in found, f"two README blocks are marked run:{name}"
        found[name] = (language, text)
    return found


def commands(text: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = (re.sub(r"(^|\s+)#.*$", "", line).strip() for line in joined.splitlines())
    return [line for line in lines if line]


def user_env(**extra: str) -> dict[str, str]:
    """A shell as the README's reader has it after installing: the virtual environment's bin first, no pool or AWS settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CLINK_"))}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **extra}


def _shell(script: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run a bash script in its own process group, the group killed whatever happens (a pool it started included)."""
    proc = subprocess.Popen(
        ["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(script, proc.returncode, out, err)


@contextmanager
def serving(serve: str, address: str, cwd: Path) -> Iterator[None]:
    """The README's serve command on ``address``, in ``cwd``, until the block ends (then SIGTERM, as Ctrl-C would)."""
    log = cwd / f"pool-{address.rsplit(':', 1)[1]}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {serve} --listen {address}"],
            cwd=cwd,
            env=user_env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        with PoolClient(address) as probe:
            while True:
                assert proc.poll() is None, f"the pool exited with {proc.returncode}: {log.read_text()[-2000:]}"
                try:
                    probe.wait_ready(timeout_s=0.5)
                    break
                except UnavailableError:
                    assert time.monotonic() < deadline, f"the pool did not answer in 30 s: {log.read_text()[-2000:]}"
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.fixture(scope="module")
def blocks() -> dict[str, tuple[str, str]]:
    """The marked blocks; every one this module runs is there, in the language it is run as."""
    found = readme_blocks()
    assert {name: language for name, (language, _) in found.items()} == {
        "command-1": "bash",
        "pool": "bash",
        "worker": "python",
        "bulk": "python",
        "s3": "bash",
        "savepoints": "bash",
        "live-pool": "bash",
        "live": "python",
    }
    for tool in ("clink", "clink-pool", "python"):
        assert (BIN / tool).exists(), f"{tool} is not installed next to {sys.executable}: run the README's first command"
    return found


def test_command_1_runs_the_demo_and_leaves_the_folder_it_runs_in_alone(blocks, tmp_path) -> None:
    first = commands(blocks["command-1"][1])[0]
    venv, install, demo = (step.strip() for step in first.split("&&"))
    assert (venv, install) == ("python3 -m venv .venv", ".venv/bin/pip install -e '.[cli]'")  # done: this suite runs in it
    assert demo == ".venv/bin/clink demo"
    done = _shell(demo.replace(".venv/bin/", f"{BIN}/"), tmp_path, user_env(), timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "exactly-once: all 85 words counted once" in done.stdout and "pool stopped" in done.stdout
    assert list(tmp_path.iterdir()) == []  # the demo's store was its own temporary folder


def test_the_worker_example_runs_on_an_empty_pool_and_again_after_a_restart(blocks, tmp_path) -> None:
    (serve,) = commands(blocks["pool"][1])
    assert serve == "clink-pool serve"
    worker = blocks["worker"][1]
    assert README_ADDRESS in worker
    outputs = []
    for _ in range(2):  # the second time on a new pool process: the state comes back from the store alone
        address = f"127.0.0.1:{free_port()}"
        with serving(serve, address, tmp_path):
            (tmp_path / "worker.py").write_text(worker.replace(README_ADDRESS, address))
            done = _shell("python worker.py", tmp_path, user_env(), timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stderr == ""
        outputs.append(done.stdout)
    first, second = outputs
    assert "restored nothing: a new job starts empty" in first and "count of 'be': 2" in first
    assert "raw 'to', 'kiwi': [2, None]" in first and "checkpoint 1 complete: True" in first
    assert "restored checkpoint 1" in second and "count of 'be': 4" in second
    assert "raw 'to', 'kiwi': [4, None]" in second and "checkpoint 2 complete: True" in second
    assert (tmp_path / "pool-data" / "jobs" / "orders" / "chk-2" / "_metadata").is_file()  # ./pool-data: serve's default store


def test_the_bulk_write_and_asynchronous_read_example_runs(blocks, tmp_path) -> None:
    (serve,) = commands(blocks["pool"][1])
    bulk = blocks["bulk"][1]
    assert README_ADDRESS in bulk
    address = f"127.0.0.1:{free_port()}"
    with serving(serve, address, tmp_path):
        (tmp_path / "bulk.py").write_text(bulk.replace(README_ADDRESS, address))
        done = _shell("python bulk.py", tmp_path, user_env(), timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    for line in ("checkpoint complete: True", "warm: full 10000 rows", "get_async: b'7'", "aget: [b'0', b'1', b'2']"):
        assert line in done.stdout, done.stdout


def test_the_live_export_example_serves_unsaved_writes_through_the_pool(blocks, tmp_path) -> None:
    (serve,) = commands(blocks["live-pool"][1])
    assert serve == "clink-pool serve --http-port 7421"
    script = blocks["live"][1]
    assert README_ADDRESS in script and "127.0.0.1:7421/" in script
    address, http_port = f"127.0.0.1:{free_port()}", free_port()
    with serving(serve.replace("7421", str(http_port)), address, tmp_path):
        (tmp_path / "live.py").write_text(script.replace(README_ADDRESS, address).replace("127.0.0.1:7421/", f"127.0.0.1:{http_port}/"))
        done = _shell("python live.py", tmp_path, user_env(COLUMNS="120"), timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    assert "serving http://127.0.0.1:" in done.stdout and "state.arrow?live=1: 2 entries" in done.stdout, done.stdout
    rows = {line.split("│")[4].strip(): line.split("│")[6].strip() for line in done.stdout.splitlines() if "│ count │" in line}
    assert rows == {"home": "2", "cart": "1"}, done.stdout  # the writes of the hot delta, decoded as int64
    assert "click-count" in done.stdout  # the operator by its uid


def test_the_s3_section_runs_against_moto(blocks, tmp_path, moto_endpoint: str) -> None:
    text = blocks["s3"][1]
    assert README_S3_ENDPOINT in text and f"s3://{README_BUCKET}/" in text  # else this test would not reach moto
    address, bucket = f"127.0.0.1:{free_port()}", f"readme-{uuid.uuid4().hex[:12]}"
    lines = [PRELUDE]
    for line in commands(text):
        line = line.replace(README_S3_ENDPOINT, moto_endpoint).replace(f"s3://{README_BUCKET}/", f"s3://{bucket}/")
        if line.startswith("clink-pool serve"):
            line = f"{line} --listen {address} >pool.log 2>&1 & pids+=($!); ready {address} || {{ cat pool.log >&2; exit 69; }}"
        lines.append(line)
    (tmp_path / "worker.py").write_text(blocks["worker"][1].replace(README_ADDRESS, address))
    # the endpoint is moto's even before the block exports it: nothing here can reach AWS
    done = _shell("\n".join(lines), tmp_path, user_env(AWS_ENDPOINT_URL_S3=moto_endpoint), timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "restored nothing: a new job starts empty" in out and "checkpoint 1 complete: True" in out
    assert re.search(r"^job\s+orders$", out, re.M), out
    assert re.search(r"^\s+1 complete\b", out, re.M), out
    assert "checkpoint 1 of job orders" in out and re.search(r"\bbe\b.*\b2\b", out), out
    assert not (tmp_path / "pool-data").exists()  # everything went to the bucket


def test_the_savepoints_section_runs_and_prints_what_it_shows(blocks, tmp_path) -> None:
    done = _shell(PRELUDE + "\n".join(commands(blocks["savepoints"][1])), tmp_path, user_env(), timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    shown = README_SHOWN_INSPECT.search((REPO / "README.md").read_text())
    assert shown is not None
    for line in shown.group(1).splitlines():  # the operators and subtasks the README shows are what inspect prints
        if line.startswith("  ") and not line.lstrip().startswith(("data/", "…", "taken", "checkpoint")):
            assert line in out.splitlines(), (line, out)
    assert "checkpoint 3 of job word-count-demo, parallelism 4 (max parallelism 128)" in out
    assert "PASS" in out and "restored savepoint" in out and "as checkpoint 1 of wc-v2" in out
    assert "imported savepoint" in out and "parallelism 8 (max parallelism 128)" in out
    assert re.search(r"^\s+7\s+112-127\s", out, re.M), out  # the eighth subtask of the imported job
    assert re.search(r"savepoints/word-count-demo/savepoint-4-[0-9a-f]{6}", out), out
    assert "deleted savepoint" in out and not (tmp_path / "demo" / "archive" / "wc-release-1" / "_metadata").exists()
    assert (tmp_path / "demo" / "pool-data" / "jobs" / "wc-v2" / "chk-1" / "_metadata").is_file()


# the inspect output the README's Savepoints section shows, from its operators line to its files line
README_SHOWN_INSPECT = re.compile(r"^```\nsavepoint file:///…/demo/archive/wc-release-1\n(.*?)^```", re.M | re.S)
