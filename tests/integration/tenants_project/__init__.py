"""A small django-tenants project (one PostgreSQL schema per tenant) whose workers use
``kumiko_jobs.tenancy_schemas.schema_activator``; tests/integration/test_tenancy_schemas_e2e.py
runs it on its own database. ``customers`` is shared (the tenants, in the public schema);
``notes`` is in SHARED_APPS and TENANT_APPS, so the public schema and every tenant's have a
notes table and a run in the wrong schema writes a row there instead of failing.
"""
