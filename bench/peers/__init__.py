"""What the peers section's workers run: the same two task bodies on every system.

``stamps`` holds the bodies (a trivial one, a 20 ms sleep) and the one Redis call each ends
with; ``dramatiq_tasks`` and ``celery_app`` declare them for Dramatiq and Celery, without
Django, as a project using those would. bench/benchapp/jobs.py declares them for kumiko_jobs
and RQ enqueues ``stamps.trivial`` / ``stamps.io20`` as they are.
"""
