UPDATE jobs_job
SET status = 'queued',
    next_run_at = %(run_at)s,
    fair_at = %(run_at_place)s,
    attempt_count = attempt_count - 1,
    snooze_count = snooze_count + 1,
    current_token = NULL,
    leased_by = '',
    lease_expires_at = NULL,
    started_at = NULL,
    progress = NULL,
    progress_message = '',
    error = '',
    result_ref = NULL,
    finished_at = NULL,
    handler_unknown_since = NULL,
    limit_keys = NULL,
    updated_at = %(now)s
WHERE current_token = %(token)s
  AND status = 'running'
  AND NOT cancel_requested
  AND snooze_count < %(max_snoozes)s RETURNING id,
                                               queue,

  (SELECT was.limit_keys
   FROM jobs_job AS was
   WHERE was.id = jobs_job.id) AS limit_keys
