"""Several `clink-pool serve` processes on one S3 bucket (SeaweedFS): start, SIGKILL, restart on the same port, stop; logs kept."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from store.objects import StoreConfig
from tests.seaweed_fixtures import ACCESS_KEY, SECRET_KEY, _free_ports, _weed

REPO = Path(__file__).resolve().parents[1]
POOL_READY_TIMEOUT_S = 60  # a pool process imports grpc, pyarrow and boto3: seconds on a loaded 2-core machine
SEAWEED_READY_TIMEOUT_S = 60
REBIND_TIMEOUT_S = 15  # a restart on the port a killed pool held retries its bind this long
LOG_TAIL_CHARS = 4000
EXIT_UNAVAILABLE = 69  # clink-pool serve's exit code when it cannot bind its port or reach its store
# serve flags of a pool that maintains its jobs itself every second: folds parts over 2 layers, keeps the newest 2
# checkpoints, collects garbage past the smallest minimum age serve accepts (over LifecycleConfig.max_write_s, 1800 s)
MAINTENANCE_ARGS: tuple[str, ...] = (
    "--maintenance",
    "on",
    "--maintenance-interval",
    "1s",
    "--compact-max-layers",
    "2",
    "--keep-last",
    "2",
    "--gc-min-age",
    "1801s",
)


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log file ('' when it is not there)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


@dataclass(frozen=True)
class PoolProcessConfig:
    """How the pool processes of a group are started: the store, S3 endpoint and credentials, and extra serve flags."""

    store_uri: str
    s3: StoreConfig
    log_dir: Path
    # more `clink-pool serve` flags, e.g. ("--maintenance", "on", "--maintenance-interval", "1s")
    serve_args: tuple[str, ...] = ()
    max_workers: int = 8
    log_level: str = "info"


def _drain(stream: IO[bytes], lines: queue.Queue[bytes]) -> None:
    """Every line of ``stream`` into ``lines``, then b"" at its end."""
    for line in iter(stream.readline, b""):
        lines.put(line)
    lines.put(b"")


class PoolProcess:
    """One `python -m clink.cli.pool serve` process; its JSON ready line gives the address; restartable on the same port."""

    def __init__(self, name: str, config: PoolProcessConfig) -> None:
        self.name = name
        self.config = config
        self.port = 0  # 0 until the first start picks one; every restart binds it again
        self.incarnation = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = config.log_dir / f"pool-{name}.log"
        self.metrics_port = 0
        self._log: IO[bytes] | None = None
        self._lines: queue.Queue[bytes] = queue.Queue()
        self.exit_codes: list[int] = []  # of every incarnation that ended (-9 for a SIGKILL)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _command(self) -> list[str]:
        cfg = self.config
        cmd = [
            sys.executable,
            "-m",
            "clink.cli.pool",
            "serve",
            "--store",
            cfg.store_uri,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--metrics-port",
            "0",
            "--output",
            "json",
            "--grace",
            "2",
            "--max-workers",
            str(cfg.max_workers),
            "--log-level",
            cfg.log_level,
        ]
        if cfg.s3.endpoint_url:
            cmd += ["--s3-endpoint-url", cfg.s3.endpoint_url]
        if cfg.s3.region:
            cmd += ["--s3-region", cfg.s3.region]
        return cmd + list(cfg.serve_args)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.pop(name, None)
        env["AWS_ACCESS_KEY_ID"] = self.config.s3.access_key_id or ACCESS_KEY
        env["AWS_SECRET_ACCESS_KEY"] = self.config.s3.secret_access_key or SECRET_KEY
        return env

    def launch(self) -> None:
        """Start the process (without waiting for it): the first start on a free port, a restart on the same one."""
        assert self.proc is None or self.proc.poll() is not None, f"pool {self.name} is running already"
        self.incarnation += 1
        self.log_path = self.config.log_dir / f"pool-{self.name}.{self.incarnation}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115  # closed when the process ends (_reap)
        self.proc = subprocess.Popen(self._command(), cwd=REPO, env=self._env(), stdout=subprocess.PIPE, stderr=self._log)
        lines: queue.Queue[bytes] = queue.Queue()
        self._lines = lines
        stdout = self.proc.stdout
        assert stdout is not None
        # drains stdout for the process's whole life, so a chatty pool never blocks on a full pipe
        threading.Thread(target=_drain, args=(stdout, lines), daemon=True).start()

    def wait_ready(self, timeout_s: float = POOL_READY_TIMEOUT_S) -> None:
        """Wait for the ready line; AssertionError with the log's tail when it does not come or the process exits."""
        assert self.proc is not None
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise AssertionError(f"pool {self.name} not ready in {timeout_s:.0f}s:\n{log_tail(self.log_path)}") from None
        if not line:
            code = self.proc.wait(timeout=10)
            self._reap()
            raise PoolExited(code, f"pool {self.name} exited early ({code}):\n{log_tail(self.log_path)}")
        ready = json.loads(line)
        assert ready["event"] == "serving", ready
        self.port = int(ready["port"])
        self.metrics_port = int(ready["metrics_port"])

    def start(self, timeout_s: float = POOL_READY_TIMEOUT_S) -> PoolProcess:
        """Start and wait until it serves; a restart whose port is not free yet (the killed one's sockets) tries again."""
        deadline = time.monotonic() + timeout_s
        rebind_until = time.monotonic() + REBIND_TIMEOUT_S
        while True:
            self.launch()
            try:
                self.wait_ready(max(1.0, deadline - time.monotonic()))
                return self
            except PoolExited as exc:
                port_busy = bool(self.port) and exc.code == EXIT_UNAVAILABLE and "cannot listen" in str(exc)
                if not port_busy or time.monotonic() > min(deadline, rebind_until):
                    raise
                time.sleep(0.2)

    def sigkill(self) -> None:
        """SIGKILL the running process: no drain, no goodbye (a crash)."""
        assert self.proc is not None and self.proc.poll() is None, f"pool {self.name} is not running"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reap()

    def terminate(self, timeout_s: float = 15, signalled: bool = False) -> int:
        """SIGTERM (unless ``signalled`` already) and wait for the graceful exit (killed after ``timeout_s``); the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None and not signalled:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        """Make sure the process is gone (SIGKILL when it still runs)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None and self.proc.returncode is not None and self._log is not None:
            self.exit_codes.append(self.proc.returncode)
            self._log.close()
            self._log = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def scrape(self) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        """This incarnation's Prometheus samples: sample name -> sorted label pairs -> value."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:  # noqa: S310  # loopback
            text = resp.read().decode()
        samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return samples

    def requests_served(self, samples: dict[str, dict[tuple[tuple[str, str], ...], float]] | None = None) -> dict[str, int]:
        """RemotePool RPCs this incarnation finished, by method (every status code; health checks not counted)."""
        served: dict[str, int] = {}
        for labels, value in (samples or self.scrape()).get("clink_pool_requests_total", {}).items():
            method = dict(labels)["method"]
            if "Health" not in method:
                served[method] = served.get(method, 0) + int(value)
        return served

    def log_records(self) -> list[dict[str, object]]:
        """Every incarnation's log lines (JSON with --output json); a line that is not JSON (grpc's own) as level "raw"."""
        records: list[dict[str, object]] = []
        for n in range(1, self.incarnation + 1):
            path = self.config.log_dir / f"pool-{self.name}.{n}.log"
            for line in path.read_text(errors="replace").splitlines() if path.exists() else ():
                try:
                    record = json.loads(line)
                except ValueError:
                    record = None
                records.append(
                    {**record, "incarnation": n} if isinstance(record, dict) else {"level": "raw", "msg": line, "incarnation": n}
                )
        return records

    def logs(self) -> str:
        """Every incarnation's log tail, for a failure message."""
        parts = []
        for n in range(1, self.incarnation + 1):
            path = self.config.log_dir / f"pool-{self.name}.{n}.log"
            parts.append(f"--- pool {self.name} incarnation {n} ({path}) ---\n{log_tail(path)}")
        return "\n".join(parts)


def maintenance_counts(samples: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> dict[str, int]:
    """A pool's maintenance counters from its samples: task runs by outcome, errors, layers folded, checkpoints deleted, bytes."""
    counts: dict[str, int] = {}
    for labels, value in samples.get("clink_pool_maintenance_runs_total", {}).items():
        key = "runs_{task}_{outcome}".format(**dict(labels))
        counts[key] = counts.get(key, 0) + int(value)
    for name, metric in (
        ("errors", "clink_pool_maintenance_errors_total"),
        ("layers_folded", "clink_pool_maintenance_layers_folded_total"),
        ("checkpoints_deleted", "clink_pool_maintenance_checkpoints_deleted_total"),
        ("bytes_reclaimed", "clink_pool_maintenance_reclaimed_bytes_total"),
    ):
        counts[name] = int(sum(samples.get(metric, {}).values()))
    return counts


def store_counts(samples: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> dict[str, int]:
    """A pool's object-store and data-file cache counters from its samples: bytes read and written, cache hits and misses."""
    names = {
        "store_read_bytes": "clink_pool_store_read_bytes_total",
        "store_written_bytes": "clink_pool_store_written_bytes_total",
        "cache_hits": "clink_pool_cache_hits_total",
        "cache_misses": "clink_pool_cache_misses_total",
    }
    return {name: int(sum(samples.get(metric, {}).values())) for name, metric in names.items()}


def add_counts(total: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """``total`` with ``more`` added key by key."""
    for key, value in more.items():
        total[key] = total.get(key, 0) + value
    return total


class PoolExited(AssertionError):
    """A pool process exited before its ready line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class PoolGroup:
    """N pool processes on one store; ``addresses`` is the comma list a client takes. A context manager: all stop at exit."""

    config: PoolProcessConfig
    size: int
    pools: list[PoolProcess] = field(default_factory=list)

    def start(self) -> PoolGroup:
        """Start every pool at once (their imports overlap) and wait until each serves."""
        self.pools = [PoolProcess(chr(ord("a") + i), self.config) for i in range(self.size)]
        try:
            for pool in self.pools:
                pool.launch()
            for pool in self.pools:
                pool.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def addresses(self) -> list[str]:
        return [p.address for p in self.pools]

    @property
    def address_list(self) -> str:
        return ",".join(self.addresses)

    def kill(self, index: int) -> None:
        """SIGKILL pool ``index``."""
        self.pools[index].sigkill()

    def restart(self, index: int) -> None:
        """Start pool ``index`` again on its port."""
        self.pools[index].start()

    def logs(self) -> str:
        return "\n".join(p.logs() for p in self.pools)

    def stop(self) -> list[int]:
        """SIGTERM every pool still running (graceful drain), SIGKILL stragglers; their exit codes."""
        signalled = []
        for pool in self.pools:  # all at once: their drains overlap
            signalled.append(pool.running)
            if pool.running:
                assert pool.proc is not None
                pool.proc.send_signal(signal.SIGTERM)
        return [pool.terminate(signalled=sent) for pool, sent in zip(self.pools, signalled, strict=True)]

    def __enter__(self) -> PoolGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def create_bucket(s3: StoreConfig, bucket: str) -> None:
    """Create ``bucket`` (every pool of a group then serves it without --create-bucket, and none races to create it)."""
    from store.s3 import S3Store

    S3Store(bucket, "", s3).create_bucket()


class SeaweedServer:
    """A single-process SeaweedFS (master, volume, filer, S3) on loopback, for the benches (tests use the ``seaweed`` fixture)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.config: StoreConfig | None = None

    def start(self) -> StoreConfig:
        """Start it and wait until its S3 gateway takes a bucket and an object; its StoreConfig."""
        import snapshot
        from store.s3 import S3Store

        self.root.mkdir(parents=True, exist_ok=True)
        config_path = self.root / "s3.json"
        identity = {
            "name": "clink",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config_path.write_text(json.dumps({"identities": [identity]}))
        ports = _free_ports(8)
        (self.root / "data").mkdir(exist_ok=True)
        names = (
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
        )
        cmd = [_weed(), "server", "-s3", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        cmd += [f"-{name}={port}" for name, port in zip(names, ports, strict=True)]
        cmd += [f"-s3.config={config_path}", "-master.volumeSizeLimitMB=64", "-volume.max=64", "-s3.port.iceberg=0", "-s3.port.lance=0"]
        log_path = self.root / "weed.log"
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.config = StoreConfig(
            endpoint_url=f"http://127.0.0.1:{ports[6]}",
            region="us-east-1",
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            max_attempts=2,
            connect_timeout_s=2,
            read_timeout_s=20,
        )
        probe = S3Store("clink-probe", "", StoreConfig(**{**self.config.__dict__, "max_attempts": 1}))
        deadline = time.monotonic() + SEAWEED_READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited early ({self.proc.returncode}):\n{log_tail(log_path)}")
            try:
                probe.create_bucket()
                probe.put("ready", b"1")
                return self.config
            except snapshot.ClinkError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"SeaweedFS not ready in {SEAWEED_READY_TIMEOUT_S}s:\n{log_tail(log_path)}") from None
                time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # its data is a temp dir; weed's graceful stop takes 5 s and keeps nothing needed
            self.proc.wait(timeout=10)

    def __enter__(self) -> StoreConfig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pool_group(s3: StoreConfig, bucket: str, log_dir: Path, size: int, serve_args: Sequence[str] = ()) -> PoolGroup:
    """A PoolGroup (not started) of ``size`` pools serving s3://BUCKET/pool, creating the bucket first."""
    create_bucket(s3, bucket)
    log_dir.mkdir(parents=True, exist_ok=True)
    return PoolGroup(PoolProcessConfig(store_uri=f"s3://{bucket}/pool", s3=s3, log_dir=log_dir, serve_args=tuple(serve_args)), size)
