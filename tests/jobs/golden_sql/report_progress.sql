UPDATE jobs_job
SET progress = %(progress)s,
    progress_message = %(message)s,
    updated_at = %(now)s
WHERE current_token = %(token)s
  AND status = 'running'
  AND NOT cancel_requested
  AND (progress IS NULL
       OR progress <= %(progress)s) RETURNING id
