"""The domain: models, schedules, admission and lifecycle rules, errors, time. Pure: no I/O, no SDK."""
