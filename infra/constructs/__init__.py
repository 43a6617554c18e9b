"""One construct per concern: storage, queues, functions, api, scheduler, executors, timeouts (the
timeout-handler state machine, DESIGN.md section 5), monitoring."""
