UPDATE jobs_job
SET lease_expires_at = %(lease_expires_at)s
WHERE status = 'running'
  AND leased_by = %(worker_id)s
  AND current_token IN (%(token_0)s,
                        %(token_1)s,
                        %(token_2)s) RETURNING current_token AS token,
                                               cancel_requested
