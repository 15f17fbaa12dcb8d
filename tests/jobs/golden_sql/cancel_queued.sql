UPDATE jobs_job
SET status = 'cancelled',
    finished_at = %(now)s,
    updated_at = %(now)s
WHERE scope_hash = %(scope_hash)s
  AND job_id = %(job_id)s
  AND status = 'queued' RETURNING id,
                                  scope_hash,
                                  job_id,
                                  handler,
                                  queue,
                                  status,
                                  batch_id,
                                  sequence_key
