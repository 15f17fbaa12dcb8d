UPDATE jobs_job
SET sequence_held = TRUE
WHERE id = %(id)s
  AND status = 'queued'
