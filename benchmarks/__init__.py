"""Benchmarks of the job store and worker against peer PostgreSQL queues (``make bench``)."""
