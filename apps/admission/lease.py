"""Active/standby: only the dispatcher holding a lease in Redis acts.

The holder renews the lease every quarter of its lifetime; a standby tries to take it on every
pass and does once the holder has stopped renewing (killed, partitioned, stopped).
"""

from __future__ import annotations

import logging
import time

import redis

log = logging.getLogger("sluice.dispatcher")

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class Lease:
    def __init__(self, client: redis.Redis, key: str, *, holder: str, lease_ms: int) -> None:
        self.client = client
        self.key = key
        self.holder = holder
        self.lease_ms = lease_ms
        self.held = False
        self._renew = client.register_script(RENEW)
        self._renew_at = 0.0

    def hold(self) -> bool:
        """True while this dispatcher holds the lease (taking or renewing it as due)."""
        now = time.monotonic()
        if self.held:
            if now >= self._renew_at:
                self._renew_at = now + self.lease_ms / 4000
                if not self._renew(keys=[self.key], args=[self.holder, self.lease_ms]):
                    log.warning("lost the dispatcher lease; standing by")
                    self.held = False
        elif self.client.set(self.key, self.holder, nx=True, px=self.lease_ms):
            log.info("holding the dispatcher lease: admitting and dispatching")
            self.held = True
            self._renew_at = now + self.lease_ms / 4000
        return self.held

    def give_up(self) -> None:
        """On a clean stop: the standby need not wait for the lease to expire."""
        if self.held and self.client.get(self.key) == self.holder:
            self.client.delete(self.key)
        self.held = False
