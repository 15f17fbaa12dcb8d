UPDATE jobs_jobattempt
SET status = 'interrupted',
    finished_at = %(now)s,
    error = %(reason)s
WHERE job_id = %(job)s
  AND token = %(token)s
  AND status = 'running' RETURNING id
