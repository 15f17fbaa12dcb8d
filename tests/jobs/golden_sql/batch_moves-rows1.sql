INSERT INTO jobs_batch AS b (scope_hash, batch_id, digest, total, pending, succeeded, failed, cancelled, expired, created_at)
SELECT m.scope_hash,
       m.batch_id,
       '',
       0,
       m.pending,
       m.succeeded,
       m.failed,
       m.cancelled,
       m.expired,
       %(now)s
FROM
  (SELECT v.column1 AS scope_hash,
          v.column2 AS batch_id,
          v.column3 AS pending,
          v.column4 AS succeeded,
          v.column5 AS failed,
          v.column6 AS cancelled,
          v.column7 AS expired
   FROM (
         VALUES (%(scope_hash_0)s,
                 %(batch_id_0)s,
                 %(pending_0)s,
                 %(succeeded_0)s,
                 %(failed_0)s,
                 %(cancelled_0)s,
                 %(expired_0)s)) AS v) AS m
WHERE EXISTS
    (SELECT 1
     FROM jobs_batch AS e
     WHERE e.scope_hash = m.scope_hash
       AND e.batch_id = m.batch_id)
ORDER BY m.scope_hash,
         m.batch_id ON CONFLICT (scope_hash,
                                 batch_id) DO
UPDATE
SET pending = b.pending + excluded.pending,
    succeeded = b.succeeded + excluded.succeeded,
    failed = b.failed + excluded.failed,
    cancelled = b.cancelled + excluded.cancelled,
    expired = b.expired + excluded.expired,
    finished_at = CASE
                      WHEN b.pending + excluded.pending = 0 THEN COALESCE(b.finished_at, excluded.created_at)
                      ELSE NULL
                  END RETURNING scope_hash,
                                batch_id,
                                pending
