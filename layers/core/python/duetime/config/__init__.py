"""Configuration: settings from the environment, observability, and the composition root (:mod:`duetime.config.deps`)."""
