INSERT INTO jobs_uniquehold AS h (scope_hash, unique_key, job_id, until)
VALUES (%(scope_hash)s, %(unique_key)s, %(job_id)s, %(until)s) ON CONFLICT (scope_hash, unique_key) DO
UPDATE
SET job_id = excluded.job_id,
    until = excluded.until
WHERE h.until <= %(now)s RETURNING job_id
