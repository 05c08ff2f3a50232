"""django-tenants activator without django-tenants: the error says what to install.

Its schema switching runs in a real django-tenants project on PostgreSQL:
tests/integration/test_tenancy_schemas_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.integration.support import REPO_ROOT

# A project where django-tenants is not installed: None in sys.modules makes every import of
# it (and of its submodules) raise ImportError, as in a venv without the package.
WITHOUT_DJANGO_TENANTS = textwrap.dedent("""
    import json, sys
    sys.modules["django_tenants"] = None
    import django
    django.setup()
    from kumiko_jobs.tenancy import current_tenant_id
    from kumiko_jobs.tenancy_schemas import schema_activator
    try:
        with schema_activator("1"):
            pass
    except RuntimeError as exc:
        print(json.dumps({
            "message": str(exc),
            "cause_is_import_error": isinstance(exc.__cause__, ImportError),
            "tenant": current_tenant_id(),
        }))
    else:
        print(json.dumps({"entered": True}))
""")


def test_without_django_tenants_the_activator_says_what_to_install() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_DJANGO_TENANTS], cwd=REPO_ROOT, env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "message": "schema_activator needs django-tenants: pip install 'kumiko_jobs[tenants]', or use "
        "the default TENANT_ACTIVATOR 'kumiko_jobs.tenancy.scopes_activator'.",
        "cause_is_import_error": True,
        "tenant": None,
    }
