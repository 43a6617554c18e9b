"""The embedded adapter set: SQLite for jobs, runs and queues, files for logs (standard library only).

``SqliteStore`` (:class:`~duetime.domain.ports.Store`) and ``SqliteQueues``
(:class:`~duetime.domain.ports.RunQueue`) may share one database file with any number of threads and
processes; ``FileLogs`` (:class:`~duetime.domain.ports.LogStore`) keeps logs under a directory.
"""
