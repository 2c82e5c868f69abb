"""A2: on S3 (ETag = MD5 of the bytes) a removal intent that is announced and then withdrawn puts the writers table back
to byte-identical content, so its etag comes back (ABA). A restore's acquire that checked "base exists and is not
being removed" before the removal then swaps the table successfully: the writer is registered as restored from a
checkpoint that retention has just deleted.

protocol.md I3: "A restore acquires only if its base exists and is not being removed, checked between reading the
writers table and swapping it, so a removal announced meanwhile makes the swap fail and the acquire try again".

Runs on moto's S3 server (the same fixture the test suite uses), and, for comparison, on MemoryStore (etags never repeat).
"""

from __future__ import annotations

import sys
import uuid

import snapshot as s
from pool.core import PoolCore
from pool.domain import KeyGroupRange
from pool.lifecycle import Lifecycle, LifecycleConfig
from snapshot.errors import ClinkError
from store.memory import MemoryStore
from store.objects import StoreConfig
from tests.hook_store import HookStore
from tests.pool_core_helpers import OP_IDS, commit, keyed

OP = OP_IDS["window"]
FULL = KeyGroupRange(0, 127)


def put(key, value):
    return (s.ROW_PUT, OP, key, value)


def run(inner, label: str) -> bool:
    store = HookStore(inner)
    core = PoolCore(store)
    e = core.acquire_writer("j", FULL)[0]
    for cid in (1, 2, 3):
        commit(core, "j", cid, cid - 1, FULL, e, [put(keyed("k"), f"v{cid}".encode())])
    _, etag_before = inner.get_with_etag("jobs/j/writers")

    def retention_runs() -> None:  # after the restore checked that checkpoint 1 exists, before it swaps the table
        r = Lifecycle(inner, LifecycleConfig(gc_min_age_s=0)).retain("j", keep_last=2)
        _, etag_after = inner.get_with_etag("jobs/j/writers")
        print(
            f"  [{label}] retention ran inside the acquire: deleted {r.deleted}; writers etag before {etag_before!r}, after {etag_after!r}"
        )

    store.on("head", "jobs/j/chk-1/_metadata", retention_runs, when="after")
    try:
        epoch = core.acquire_writer("j", FULL, restore_from=1)[0]
        print(f"  [{label}] restore from checkpoint 1 ACQUIRED epoch {epoch}")
    except ClinkError as exc:
        print(f"  [{label}] restore from checkpoint 1 refused: {type(exc).__name__}: {str(exc)[:90]}")
        return False
    fresh = PoolCore(inner)
    print(f"  [{label}] checkpoint 1 _metadata exists: {inner.exists('jobs/j/chk-1/_metadata')}")
    print(f"  [{label}] writers table: {inner.get('jobs/j/writers').decode()}")
    try:
        commit(fresh, "j", 2, 1, FULL, epoch, [put(keyed("k"), b"after-restore")])
        print(f"  [{label}] commit of 2 on parent 1: ok")
    except ClinkError as exc:
        print(f"  [{label}] commit of 2 on parent 1: {type(exc).__name__}: {str(exc)[:100]}")
    print(
        f"  [{label}] latest (id 0) = {fresh.reader('j').latest()}  (complete ids on store: "
        f"{sorted(int(o.key.split('/')[2][4:]) for o in inner.list('jobs/j/') if o.key.endswith('_metadata'))})"
    )
    return True


print("MemoryStore (etags never repeat):")
run(MemoryStore("a2"), "memory")

print("moto S3 (ETag = MD5 of content):")
import logging  # noqa: E402

logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer  # noqa: E402

from store.s3 import S3Store  # noqa: E402

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
try:
    host, port = server.get_host_and_port()
    cfg = StoreConfig(
        endpoint_url=f"http://{host}:{port}",
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
        max_attempts=2,
        connect_timeout_s=2,
        read_timeout_s=10,
    )
    s3 = S3Store(f"a2-{uuid.uuid4().hex[:12]}", "root", cfg)
    s3.create_bucket()
    broke = run(s3, "s3")
    print(
        "VIOLATION (I3: a restore acquired from a checkpoint deleted while it acquired; the job is wedged and latest is empty)"
        if broke
        else "held"
    )
finally:
    server.stop()
sys.exit(0)
