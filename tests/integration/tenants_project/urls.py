"""No views: the project only runs jobs."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
