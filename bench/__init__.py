"""Benchmarks of kumiko_jobs against plain RQ, side by side on one machine: ``python -m bench``.

Modules: ``environment`` (prefix, database, child processes, clean-up), ``dispatch_rate``
(enqueue side), ``worker_rate`` (worker side), ``command_counts`` (Redis commands per job),
``report`` (tables and BENCHMARKS.md), ``rqworker`` (the raw-RQ worker child process).
"""
