"""Child process for the raw-RQ baselines: one RQ worker, burst mode, WARNING logs, JSON.

``python -m bench.rqworker simple|fork QUEUE NAME`` (Redis from KUMIKO_REDIS_URL). No Django:
plain RQ, as a project without kumiko_jobs would run it.
"""

from __future__ import annotations

import os
import sys

import redis
from rq import Queue, SimpleWorker, Worker
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker

WORKER_CLASSES: dict[str, type[BaseWorker]] = {"simple": SimpleWorker, "fork": Worker}


def main(argv: list[str]) -> int:
    kind, queue_name, name = argv
    client = redis.Redis.from_url(os.environ["KUMIKO_REDIS_URL"])
    queue = Queue(queue_name, connection=client, serializer=JSONSerializer)
    worker = WORKER_CLASSES[kind]([queue], connection=client, name=name, serializer=JSONSerializer)
    worker.work(burst=True, logging_level="WARNING")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
