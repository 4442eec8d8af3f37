"""Has the broker lost the messages it held? A Redis broker without persistence (the default
on these machines) restarted, or FLUSHALL'd, comes back empty: the stages queued before are in
the database but no longer in any queue. The reaper asks on each run (`messages_lost`) and, when
so, sends every queued stage again (`stage_runs_resend_queued(broker_lost=True)`).

How: a marker key (`EPOCH_KEY`) lives in the broker's own Redis database beside the queues; it
is set when missing. Finding it missing means everything beside it went too. The first check on
a new broker also finds it missing: one round of duplicate messages, which the claim ignores.
Brokers that keep their messages on disk (the filesystem broker of `make run`) are not asked.
"""

from __future__ import annotations

import logging
import time

from celery import current_app

logger = logging.getLogger(__name__)

EPOCH_KEY = "day0:broker-epoch"


def messages_lost() -> bool:
    """True when the broker's marker was missing (and is now set again). False for a broker
    that is not Redis, or one that cannot be reached now (nothing to resend to yet)."""
    try:
        with current_app.connection_for_write() as connection:
            if connection.transport.driver_type not in ("redis",):
                return False
            client = connection.default_channel.client
            lost = bool(client.set(EPOCH_KEY, str(time.time()), nx=True))
    except Exception as exc:  # kombu/redis connection errors: the broker is down
        logger.warning("Broker check skipped: %s", " ".join(str(exc).split())[:200])
        return False
    if lost:
        logger.warning("The broker holds none of day0's marker: queued stages are sent again.")
    return lost
