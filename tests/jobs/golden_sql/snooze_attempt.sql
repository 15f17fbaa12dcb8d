UPDATE jobs_jobattempt
SET status = 'snoozed',
    finished_at = %(now)s,
    error = %(note)s
WHERE job_id = %(job)s
  AND token = %(token)s
  AND status = 'running' RETURNING id
