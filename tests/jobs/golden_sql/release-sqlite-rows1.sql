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
       (SELECT v.column1 AS scope_hash,
               v.column2 AS sequence_key
        FROM (
              VALUES (%(scope_hash_0)s,
                      %(sequence_key_0)s)) AS v) AS a
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
                              next_run_at
