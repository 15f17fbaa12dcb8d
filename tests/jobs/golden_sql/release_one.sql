UPDATE jobs_job
SET sequence_held = FALSE,
                    updated_at = %(now)s
WHERE id = %(id)s
  AND status = 'queued'
  AND sequence_held RETURNING id,
                              queue,
                              next_run_at
