UPDATE jobs_job
SET status = 'cancelled',
    finished_at = %(now)s,
    updated_at = %(now)s
WHERE id IN (%(id_0)s,
             %(id_1)s,
             %(id_2)s)
  AND status = 'queued' RETURNING id,
                                  scope_hash,
                                  job_id,
                                  handler,
                                  queue,
                                  status,
                                  batch_id,
                                  sequence_key
