WITH halted AS
  (UPDATE jobs_sequence AS s
   SET halted_by = h.job_id,
       halted_at = %(now)s
   FROM unnest(%(halt_scopes)s::varchar[], %(halt_keys)s::varchar[], %(halt_jobs)s::varchar[]) AS h(scope_hash, sequence_key, job_id)
   WHERE s.scope_hash = h.scope_hash
     AND s.sequence_key = h.sequence_key RETURNING s.scope_hash,
                                                   s.sequence_key),
     free AS
  (SELECT *
   FROM unnest(%(scopes)s::varchar[], %(keys)s::varchar[]) AS f(scope_hash, sequence_key)
   WHERE NOT EXISTS
       (SELECT 1
        FROM halted AS h
        WHERE h.scope_hash = f.scope_hash
          AND h.sequence_key = f.sequence_key))
UPDATE jobs_job
SET sequence_held = FALSE,
                    updated_at = %(now)s
WHERE id IN
    (SELECT
       (SELECT n.id
        FROM jobs_job AS n
        WHERE n.scope_hash = a.scope_hash
          AND n.sequence_key = a.sequence_key
          AND n.status IN ('queued',
                           'running')
          AND n.sequence_held = TRUE
        ORDER BY n.id
        LIMIT 1) AS id
     FROM
       (SELECT *
        FROM free) AS a
     WHERE NOT EXISTS
         (SELECT 1
          FROM jobs_sequence AS s
          WHERE s.scope_hash = a.scope_hash
            AND s.sequence_key = a.sequence_key
            AND s.halted_by IS NOT NULL)
       AND NOT EXISTS
         (SELECT 1
          FROM jobs_job AS r
          WHERE r.scope_hash = a.scope_hash
            AND r.sequence_key = a.sequence_key
            AND r.status IN ('queued',
                             'running')
            AND r.sequence_held = FALSE))
  AND status = 'queued'
  AND sequence_held RETURNING id,
                              queue,
                              next_run_at,
                              CASE
                                  WHEN next_run_at <= %(now)s THEN pg_notify(%(channel)s, queue)
                              END AS woke
