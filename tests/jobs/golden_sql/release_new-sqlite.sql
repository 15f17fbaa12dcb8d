UPDATE jobs_job
SET sequence_held = FALSE
WHERE scope_hash = %(scope_hash)s
  AND job_id = %(job_id)s
  AND status = 'queued'
  AND sequence_held RETURNING id
