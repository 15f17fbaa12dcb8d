UPDATE jobs_job
SET status = 'expired',
    finished_at = %(now)s,
    updated_at = %(now)s,
    error = %(error)s
WHERE id IN
    (SELECT id
     FROM jobs_job
     WHERE status = 'queued'
       AND start_by IS NOT NULL
       AND start_by <= %(now)s
     ORDER BY start_by
     LIMIT %(limit)s)
  AND status = 'queued'
  AND start_by IS NOT NULL
  AND start_by <= %(now)s RETURNING id,
                                    scope_hash,
                                    job_id,
                                    handler,
                                    queue,
                                    status,
                                    batch_id,
                                    sequence_key
