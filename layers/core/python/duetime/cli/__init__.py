"""The ``duetime`` command line (typer): the local stack, workers, and the API client commands."""
