UPDATE jobs_job
SET status = CASE
                 WHEN cancel_requested THEN 'cancelled'
                 WHEN COALESCE(handler_unknown_since, %(now)s) <= %(window_start)s THEN 'failed'
                 ELSE 'queued'
             END,
             finished_at = CASE
                               WHEN cancel_requested
                                    OR COALESCE(handler_unknown_since, %(now)s) <= %(window_start)s THEN %(now)s
                               ELSE NULL
                           END,
                           next_run_at = CASE
                                             WHEN cancel_requested
                                                  OR COALESCE(handler_unknown_since, %(now)s) <= %(window_start)s THEN next_run_at
                                             ELSE %(run_at)s
                                         END,
                                         fair_at = CASE
                                                       WHEN cancel_requested
                                                            OR COALESCE(handler_unknown_since, %(now)s) <= %(window_start)s THEN fair_at
                                                       ELSE %(run_at_place)s
                                                   END,
                                                   error = CASE
                                                               WHEN cancel_requested THEN ''
                                                               WHEN COALESCE(handler_unknown_since, %(now)s) <= %(window_start)s THEN %(failed)s
                                                               ELSE %(waiting)s
                                                           END,
                                                           handler_unknown_since = COALESCE(handler_unknown_since, %(now)s),
                                                           attempt_count = attempt_count - 1,
                                                           limit_keys = NULL,
                                                           updated_at = %(now)s,
                                                           current_token = NULL,
                                                           leased_by = '',
                                                           lease_expires_at = NULL,
                                                           started_at = NULL,
                                                           progress = NULL,
                                                           progress_message = '',
                                                           result_ref = NULL
WHERE current_token = %(token)s
  AND status = 'running' RETURNING id,
                                   scope_hash,
                                   job_id,
                                   handler,
                                   queue,
                                   status,
                                   batch_id,
                                   sequence_key,

  (SELECT was.limit_keys
   FROM jobs_job AS was
   WHERE was.id = jobs_job.id) AS limit_keys
