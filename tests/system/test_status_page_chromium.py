"""The status page in a real headless Chromium with JavaScript disabled: what a person sees, the link to a job, the refresh."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

import snapshot
from client.pool_client import PoolClient
from pool.server import PoolServer, PoolServerConfig
from pool.status_html import human_bytes
from pool.status_page import StatusPageConfig
from store.memory import MemoryStore
from tests.pool_server_fixtures import changelog_bytes, keyed_keys_in

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
OP = snapshot.operator_id("counter")
JOB = "orders"
FOUR = [(0, 31), (32, 63), (64, 95), (96, 127)]


def _require_chromium() -> None:
    """Fail (never skip) when Debian's chromium or chromium-driver is missing: .ci/run installs both."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.isfile(p) and os.access(p, os.X_OK))]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not installed: this test needs Debian's chromium and chromium-driver "
            "(.ci/run installs them when missing; by hand: apt-get install -y chromium chromium-driver)",
            pytrace=False,
        )


@pytest.fixture
def browser() -> Iterator[object]:
    """Headless Chromium through /usr/bin/chromedriver (never a downloaded one), JavaScript off, a fresh profile."""
    _require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="clink-chromium-")
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
        "--blink-settings=scriptEnabled=false",
        "--window-size=1360,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def pool() -> Iterator[tuple[str, PoolClient]]:
    """A real pool over a memory store: JOB with three checkpoints by four writers, checkpoint 4 half staged, a pin, a savepoint."""
    server = PoolServer(PoolServerConfig(listen="127.0.0.1:0", http_port=0, grace_seconds=0.2), store=MemoryStore()).start()
    client = PoolClient(server.address)
    try:
        leases = [client.acquire_writer(JOB, kg) for kg in FOUR]
        for cid in (1, 2, 3):
            for i, (lease, (lo, hi)) in enumerate(zip(leases, FOUR, strict=True)):
                keys = keyed_keys_in(lo, hi, 6 + cid + i, seed=cid * 10 + i)
                delta = changelog_bytes([(snapshot.ROW_PUT, OP, k, b"value-%d" % cid) for k in keys])
                client.commit_checkpoint(JOB, cid, cid - 1, (lo, hi), lease.epoch, delta)
        for lease, (lo, hi) in list(zip(leases, FOUR, strict=True))[:2]:
            client.commit_checkpoint(JOB, 4, 3, (lo, hi), lease.epoch, changelog_bytes([(1, OP, keyed_keys_in(lo, hi, 1, 99)[0], b"x")]))
        client.pin_checkpoint(JOB, "nightly-export", 3600, checkpoint_id=2)
        client.savepoint(JOB, name="before-upgrade", checkpoint_id=3)
        client.acquire_writer("clickstream", (0, 127))
        yield f"http://127.0.0.1:{server.http_port}", client
    finally:
        client.close()
        server.stop(0)


def _rows(driver, css: str) -> list[list[str]]:
    """The visible text of each cell of each body row of the table ``css``, as Chromium renders it."""
    from selenium.webdriver.common.by import By

    table = driver.find_element(By.CSS_SELECTOR, css)
    assert table.is_displayed()
    return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")] for row in table.find_elements(By.CSS_SELECTOR, "tbody tr")]


def test_chromium_without_javascript_shows_jobs_checkpoints_and_follows_the_link(browser, pool, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    base, client = pool
    driver = browser
    # JavaScript really is off in this browser: a page's script does not run
    driver.get("data:text/html,<title>still</title><script>document.title='ran'</script>")
    assert driver.title == "still"

    driver.get(base + "/")
    assert driver.title == "clink pool — jobs"
    infos = [i for i in client.list_checkpoints(JOB, include_incomplete=True)]
    latest = max((i for i in infos if i.complete), key=lambda i: i.checkpoint_id)
    jobs = {row[0]: row for row in _rows(driver, "table.jobs")}
    assert sorted(jobs) == client.list_jobs() == ["clickstream", JOB]
    row = jobs[JOB]
    assert row[1] == str(latest.checkpoint_id) and row[3] == str(len(latest.committed_ranges))
    assert row[5] == human_bytes(latest.total_bytes) and "1 incomplete" in row[6]
    assert jobs["clickstream"][1] == "none yet"
    refresh = driver.find_element(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]').get_attribute("content")
    assert refresh == str(StatusPageConfig().refresh_s)
    assert f"refreshes every {refresh} s" in driver.find_element(By.TAG_NAME, "header").text
    assert "maintenance off" in driver.find_element(By.TAG_NAME, "main").text

    # following the job's link (a plain link: no script needed) opens its page
    driver.find_element(By.LINK_TEXT, JOB).click()
    assert driver.current_url == f"{base}/status/jobs/{quote(JOB, safe='')}"
    checkpoints = {row[0]: row for row in _rows(driver, "table.checkpoints")}
    assert sorted(checkpoints, key=int) == [str(i.checkpoint_id) for i in infos]
    for info in infos:
        shown = checkpoints[str(info.checkpoint_id)]
        assert shown[1] == ("complete" if info.complete else "incomplete")
        if info.complete:
            assert shown[7] == human_bytes(info.total_bytes) and shown[8] == str(info.num_rows)
    assert "missing 64-127" in checkpoints["4"][4]
    assert checkpoints["2"][9] == "nightly-export"
    parts = _rows(driver, "table.parts")
    assert [p[0] for p in parts] == [f"{lo}-{hi}" for lo, hi in FOUR]
    assert [r[0] for r in _rows(driver, "table.savepoints")] == [f"{JOB}/before-upgrade"]
    assert len(_rows(driver, "table.writers")) == 4
    # and a checkpoint's own page from its link
    driver.find_element(By.LINK_TEXT, "4").click()
    staged = {row[0]: row for row in _rows(driver, "table.staged")}
    assert sorted(staged) == ["0-31", "32-63"] and all(r[2] == "current writer" for r in staged.values())

    driver.get(f"{base}/status/jobs/{quote(JOB, safe='')}")
    png = driver.get_screenshot_as_png()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    (tmp_path / "status-page.png").write_bytes(png)
