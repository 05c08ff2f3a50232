"""WSGI entry point of the demo/test project."""

import os

from django.core.handlers.wsgi import WSGIHandler
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

application: WSGIHandler = get_wsgi_application()
