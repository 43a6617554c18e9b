"""Services: what Duetime does with jobs and runs, written against the ports in :mod:`duetime.domain.ports`."""
