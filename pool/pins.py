"""Pins: a holder protects a complete checkpoint from retention until its pin expires (bounded in number and length)."""

from __future__ import annotations

import json

from pool.lifecycle_context import LifecycleContext
from snapshot.errors import CorruptDataError, InvalidArgumentError, LimitExceededError, NotFoundError, PermissionDeniedError
from store.layout import metadata_key, parse_job_key, pin_key, pin_prefix
from store.objects import ObjectInfo

PIN_FORMAT = "clink.pin"


class Pins:
    """Pins of the jobs of one store: made, renewed and dropped by holders; read by retention, GC and inspect."""

    def __init__(self, context: LifecycleContext) -> None:
        self.context = context

    def pin(self, job: str, checkpoint_id: int, holder: str, ttl_s: float, owner: str | None = None) -> tuple[int, int]:
        """Protect a complete checkpoint (0 = latest) from retention until now + ttl_s (renewable): (checkpoint id, expiry ms).

        ``owner``: who pins (a token's identity through the RPC; None for the operator's commands); a pin of the same holder
        made by another owner is theirs and is not taken over. A job holds at most max_pins_per_job pins, each at most
        max_pin_ttl_s long, so pins cannot block retention without bound.
        """
        job, holder = self.context.job(job), self.context.name(holder, "pin holder")
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s:
            raise InvalidArgumentError(f"pin ttl {ttl_s!r} must be a positive number of seconds")
        if ttl_s > self.context.config.max_pin_ttl_s:
            raise LimitExceededError(
                f"pin ttl {ttl_s:g} s is longer than the pool allows ({self.context.config.max_pin_ttl_s:g} s); renew a shorter pin instead"
            )
        _, manifest, _ = self.context.open_checkpoint(job, checkpoint_id)
        key = pin_key(job, manifest.checkpoint_id, holder)
        current = self._body(key)
        if current is not None and current.get("owner") != owner and owner is not None:
            raise PermissionDeniedError(
                f"pin {holder!r} of checkpoint {manifest.checkpoint_id} is held by another token; pick another holder name"
            )
        if current is None:
            pins = sum(1 for _ in self.context.store.list(pin_prefix(job)))
            if pins >= self.context.config.max_pins_per_job:
                raise LimitExceededError(f"job {job} holds {pins} pins, the pool's limit (max_pins_per_job); unpin or let some expire")
        expires = self.context.now_ms() + int(ttl_s * 1000)
        body = {"format": PIN_FORMAT, "job": job, "checkpoint_id": manifest.checkpoint_id, "holder": holder, "expires_at_ms": expires}
        if owner is not None:
            body["owner"] = owner
        self.context.store.put(key, json.dumps(body, sort_keys=True).encode())
        table, _ = self.context.fencing.read(job)  # read after the pin landed: retention re-lists pins after announcing what it removes
        if manifest.checkpoint_id in table.retiring_ids(self.context.now_ms()) or not self.context.store.exists(
            metadata_key(job, manifest.checkpoint_id)
        ):
            self.context.store.delete(key)
            raise NotFoundError(f"checkpoint {manifest.checkpoint_id} of job {job} is being deleted; it cannot be pinned")
        return manifest.checkpoint_id, expires

    def _body(self, key: str) -> dict | None:
        """A pin's body, None when there is none; CorruptDataError when it is not JSON."""
        try:
            body = json.loads(self.context.store.get(key))
        except NotFoundError:
            return None
        except ValueError:
            raise CorruptDataError(f"pin {key} is malformed") from None
        return body if isinstance(body, dict) else {}

    def unpin(
        self,
        job: str,
        checkpoint_id: int,
        holder: str,
        owner: str | None = None,
        may_unpin_others: bool = True,
        latest_for_0: bool = False,
    ) -> tuple[int, bool]:
        """Drop a pin (idempotent): (checkpoint id, whether a pin was there to remove); ``latest_for_0`` reads 0 as the
        latest complete checkpoint, as pin does (`clink-pool unpin`; the RPC keeps asking for a positive id).
        One another owner made goes only with ``may_unpin_others`` (write access to the job).
        """
        job, holder = self.context.job(job), self.context.name(holder, "pin holder")
        if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < (0 if latest_for_0 else 1):
            raise InvalidArgumentError(f"checkpoint id {checkpoint_id!r} of a pin must be a positive integer")
        if checkpoint_id == 0:
            checkpoint_id = self.context.open_checkpoint(job, 0)[1].checkpoint_id
        key = pin_key(job, checkpoint_id, holder)
        current = self._body(key)
        if not may_unpin_others and current is not None and current.get("owner") != owner:
            raise PermissionDeniedError(
                f"pin {holder!r} of checkpoint {checkpoint_id} was made by another token; removing it needs write access"
            )
        if current is None:
            return checkpoint_id, False
        self.context.store.delete(key)
        return checkpoint_id, True

    def held_by(self, job: str, holder: str) -> list[int]:
        """The checkpoints of ``job`` that ``holder`` pins (expired pins included), sorted."""
        job, holder = self.context.job(job), self.context.name(holder, "pin holder")
        found = []
        for info in self.context.store.list(pin_prefix(job)):
            parsed = parse_job_key(info.key)
            if parsed is not None and parsed.kind == "pin" and info.key == pin_key(job, parsed.pin_checkpoint, holder):
                found.append(parsed.pin_checkpoint)
        return sorted(found)

    def live(self, infos: list[ObjectInfo], now_ms: int) -> tuple[set[int], list[str]]:
        """(checkpoint ids held by unexpired pins, keys of expired pins) among listed pin objects."""
        held, expired = set(), []
        for info in infos:
            try:
                body = json.loads(self.context.store.get(info.key))
                cid, expires = int(body["checkpoint_id"]), int(body["expires_at_ms"])
            except NotFoundError:
                continue
            except (ValueError, KeyError, TypeError):
                raise CorruptDataError(f"pin {info.key} is malformed") from None
            if expires > now_ms:
                held.add(cid)
            else:
                expired.append(info.key)
        return held, expired

    def summaries(self, infos: list[ObjectInfo], now_ms: int) -> list[dict]:
        """Listed pins as plain dicts for inspect (checkpoint, holder, expiry, expired); unreadable ones left out."""
        out = []
        for info in infos:
            try:
                body = json.loads(self.context.store.get(info.key))
            except (NotFoundError, ValueError):
                continue
            out.append(
                {
                    "checkpoint_id": body.get("checkpoint_id"),
                    "holder": body.get("holder"),
                    "expires_at_ms": body.get("expires_at_ms"),
                    "expired": body.get("expires_at_ms", 0) <= now_ms,
                }
            )
        return out
