"""Make docs/status-page.png: a demo pool (jobs, checkpoints, pins, a savepoint, live writers, maintenance) in headless Chromium, JavaScript off.

Run from the repository root: .venv/bin/python scripts/status_page_screenshot.py [--out docs/status-page.png] [--page job|index]
Needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver; .ci/run installs them).
"""

from __future__ import annotations

import argparse
import base64
import random
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402 - after the path is set

import snapshot  # noqa: E402
from client.pool_client import PoolClient  # noqa: E402
from pool.maintenance import MaintenanceConfig  # noqa: E402
from pool.server import PoolServer, PoolServerConfig  # noqa: E402
from store.memory import MemoryStore  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
OPS = {name: snapshot.operator_id(name) for name in ("word-count", "window", "dedup")}
WIDTH = 1360


def chromium(user_data_dir: str, width: int = WIDTH, height: int = 900):
    """A headless Chromium driven through /usr/bin/chromedriver with JavaScript disabled (never a downloaded browser)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--blink-settings=scriptEnabled=false",
        f"--window-size={width},{height}",
        f"--user-data-dir={user_data_dir}",
    ):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def _keys(lo: int, hi: int, count: int, rng: random.Random) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < count:
        user = rng.randbytes(6)
        if lo <= snapshot.key_group(user) <= hi:
            out.append(snapshot.encode_keyed_key("v", user))
    return out


def _delta(keys: list[bytes], rng: random.Random, op: int) -> bytes:
    values = [rng.randbytes(rng.randrange(40, 400)) for _ in keys]
    table = pa.table(
        {
            "row_kind": pa.array([snapshot.ROW_PUT] * len(keys), pa.uint8()),
            "op_id": pa.array([op] * len(keys), pa.uint64()),
            "key_bytes": pa.array(keys, pa.binary()),
            "value_bytes": pa.array(values, pa.binary()),
        }
    )
    return snapshot.SnapshotArrowWriter(changelog=True).write(table)


def _run_job(client: PoolClient, job: str, ranges: list[tuple[int, int]], checkpoints: int, rows: int, rng: random.Random) -> list:
    leases = [client.acquire_writer(job, r) for r in ranges]
    for cid in range(1, checkpoints + 1):
        for lease, (lo, hi) in zip(leases, ranges, strict=True):
            op = OPS["word-count"] if cid % 2 else OPS["window"]
            client.commit_checkpoint(
                job, cid, cid - 1, (lo, hi), lease.epoch, _delta(_keys(lo, hi, rows, rng), rng, op), operators={op: ""}
            )
    return leases


def demo_pool() -> tuple[PoolServer, str]:
    """A pool over a memory store holding three jobs in different states; (server, base URL of its HTTP port)."""
    config = PoolServerConfig(
        listen="127.0.0.1:0",
        http_port=0,
        grace_seconds=0.2,
        maintenance=MaintenanceConfig(interval_s=3600.0, compact_max_layers=4, keep_last=5, gc_min_age_s=3600.0),
    )
    server = PoolServer(config, store=MemoryStore()).start()
    rng = random.Random(18)
    client = PoolClient(server.address)
    four = [(0, 31), (32, 63), (64, 95), (96, 127)]
    orders = _run_job(client, "orders", four, 6, 120, rng)
    # checkpoint 7 in flight: two of four subtasks staged their parts
    for lease, (lo, hi) in list(zip(orders, four, strict=True))[:2]:
        client.commit_checkpoint("orders", 7, 6, (lo, hi), lease.epoch, _delta(_keys(lo, hi, 40, rng), rng, OPS["dedup"]))
    client.pin_checkpoint("orders", "nightly-export", 6 * 3600, checkpoint_id=5)
    client.pin_checkpoint("orders", "backfill-reader", 1800, checkpoint_id=6)
    client.savepoint("orders", name="before-upgrade", checkpoint_id=4)
    for lease, (lo, hi) in zip(orders, four, strict=True):
        client.announce_live_export("orders", (lo, hi), lease.epoch, f"http://10.0.3.{lo // 32 + 11}:9250/live", "demo-token", 120)
    _run_job(client, "clickstream-sessions", [(0, 63), (64, 127)], 3, 200, rng)
    client.acquire_writer("fraud-scores", (0, 127))  # connected, no checkpoint yet
    if server.maintainer is not None:
        server.maintainer.run_once()
    client.close()
    return server, f"http://127.0.0.1:{server.http_port}"


def screenshot(url: str, out: Path) -> None:
    """Open ``url`` in headless Chromium (JavaScript off) and save a screenshot of the whole page as PNG."""
    with tempfile.TemporaryDirectory(prefix="clink-chromium-") as profile:
        driver = chromium(profile)
        try:
            driver.get(url)
            # the whole page through the DevTools protocol (no script runs in the page): its laid-out size, then one capture
            size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
            clip = {"x": 0, "y": 0, "width": WIDTH, "height": min(int(size["height"]) + 16, 6000), "scale": 1}
            shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip})
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(base64.b64decode(shot["data"]))
        finally:
            driver.quit()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/status-page.png"))
    parser.add_argument("--page", choices=("job", "index"), default="job", help="the job page of the demo's 'orders', or the index")
    args = parser.parse_args()
    server, base = demo_pool()
    try:
        url = f"{base}/status/jobs/{quote('orders', safe='')}" if args.page == "job" else f"{base}/"
        screenshot(url, args.out)
    finally:
        server.stop(0)
    print(f"wrote {args.out} from {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
