SELECT pg_notify(%(channel)s, %(payload)s)
