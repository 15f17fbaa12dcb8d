SELECT pg_advisory_xact_lock(%s, hashtext(%s)),
       pg_notify(%s, '')
