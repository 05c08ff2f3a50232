"""A hook module that fails on import with something other than ImportError (a service it needs
at import time is down): system checks report it instead of crashing."""

raise RuntimeError("the tenant directory is not reachable")
