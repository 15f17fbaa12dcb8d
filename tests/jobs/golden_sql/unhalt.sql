UPDATE jobs_sequence
SET halted_by = NULL,
    halted_at = NULL,
    updated_at = %(now)s
WHERE scope_hash = %(scope_hash)s
  AND sequence_key = %(sequence_key)s
  AND halted_by = %(job_id)s RETURNING open
