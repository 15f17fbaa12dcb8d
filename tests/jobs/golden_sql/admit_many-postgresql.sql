WITH m AS
  (SELECT *
   FROM unnest(%(scopes)s::varchar[], %(keys)s::varchar[], %(counts)s::bigint[], %(firsts)s::varchar[]) AS m(scope_hash, sequence_key, n, first_job)),
     admitted AS
  (INSERT INTO jobs_sequence AS s (scope_hash, sequence_key, open, updated_at) SELECT scope_hash,
                                                                                      sequence_key,
                                                                                      n,
                                                                                      %(now)s
   FROM m
   ORDER BY scope_hash,
            sequence_key ON CONFLICT (scope_hash,
                                      sequence_key) DO UPDATE
   SET open = s.open + excluded.open,
              updated_at = excluded.updated_at RETURNING s.scope_hash,
                                                         s.sequence_key,
                                                         s.open,
                                                         s.halted_by)
UPDATE jobs_job AS j
SET sequence_held = FALSE
FROM admitted AS a
JOIN m ON m.scope_hash = a.scope_hash
AND m.sequence_key = a.sequence_key
WHERE j.scope_hash = m.scope_hash
  AND j.job_id = m.first_job
  AND a.open = m.n
  AND a.halted_by IS NULL
  AND j.sequence_held
  AND j.status = 'queued' RETURNING j.id
