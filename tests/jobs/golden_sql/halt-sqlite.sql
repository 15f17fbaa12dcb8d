UPDATE jobs_sequence
SET halted_by = %(job_id)s,
    halted_at = %(now)s
WHERE scope_hash = %(scope_hash)s
  AND sequence_key = %(sequence_key)s
