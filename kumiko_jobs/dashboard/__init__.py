"""django-rq's dashboard and ``rqstats`` for kumiko lanes, for operators only.

- ``setup``: supplies ``RQ_QUEUES`` entries for the lanes and ``RQ["QUEUE_CLASS"]`` (no settings
  for the project to write);
- ``queue``: ``LaneQueue``, which counts and lists a lane's per-tenant flows;
- ``access``: the operator check (superusers, or ``kumiko_jobs.use_rq_dashboard``);
- ``views`` / ``patterns`` / ``urls``: django-rq's views with writes through kumiko's API
  (``cancelling``, ``requeueing``), mounted with ``include("kumiko_jobs.dashboard.urls")``;
- ``admin``: django-rq's admin link, shown to operators only;
- ``checks``: ``kumiko_jobs.W111``-``W113``.

Only ``setup`` and ``checks`` are imported without django-rq being installed.
"""
