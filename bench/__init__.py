"""Benchmarks of kumiko_jobs against plain RQ and its peers, side by side on one machine: ``python -m bench``.

Modules: ``environment`` (prefix, database, child processes, clean-up), ``children`` (workers
left running while the bench works), ``dispatch_rate`` (enqueue side), ``worker_rate`` (worker
side), ``command_counts`` (Redis commands per job), ``tenancy`` (tenancy at scale),
``peer_rates`` (runjobs vs Dramatiq and Celery; their task modules in ``peers/``), ``report``
(tables and BENCHMARKS.md), ``rqworker`` (the raw-RQ worker child process).
"""
