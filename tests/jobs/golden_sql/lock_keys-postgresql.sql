SELECT count(pg_advisory_xact_lock(k)) AS locked
FROM unnest(%(keys)s::bigint[]) AS k
