"""One construct per concern: storage, queues, functions, api, scheduler, executors, monitoring.

The timeout-handler state machine (DESIGN.md section 5) comes with a later issue and has no construct yet.
"""
