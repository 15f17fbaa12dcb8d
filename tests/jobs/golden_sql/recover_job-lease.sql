UPDATE jobs_job
SET status = CASE
                 WHEN cancel_requested THEN 'cancelled'
                 WHEN NOT cancel_requested
                      AND interruption_count + 1 < %(max_interruptions)s THEN 'queued'
                 ELSE 'interrupted'
             END,
             attempt_count = CASE
                                 WHEN cancel_requested THEN attempt_count
                                 ELSE attempt_count - 1
                             END,
                             interruption_count = CASE
                                                      WHEN cancel_requested THEN interruption_count
                                                      ELSE interruption_count + 1
                                                  END,
                                                  keeps_killing_worker = NOT cancel_requested
AND interruption_count + 1 >= %(max_interruptions)s,
    next_run_at = CASE
                      WHEN NOT cancel_requested
                           AND interruption_count + 1 < %(max_interruptions)s THEN %(now)s
                      ELSE next_run_at
                  END,
                  started_at = CASE
                                   WHEN NOT cancel_requested
                                        AND interruption_count + 1 < %(max_interruptions)s THEN NULL
                                   ELSE started_at
                               END,
                               finished_at = CASE
                                                 WHEN NOT cancel_requested
                                                      AND interruption_count + 1 < %(max_interruptions)s THEN NULL
                                                 ELSE %(now)s
                                             END,
                                             progress = CASE
                                                            WHEN NOT cancel_requested
                                                                 AND interruption_count + 1 < %(max_interruptions)s THEN NULL
                                                            ELSE progress
                                                        END,
                                                        progress_message = CASE
                                                                               WHEN NOT cancel_requested
                                                                                    AND interruption_count + 1 < %(max_interruptions)s THEN ''
                                                                               ELSE progress_message
                                                                           END,
                                                                           handler_unknown_since = CASE
                                                                                                       WHEN NOT cancel_requested
                                                                                                            AND interruption_count + 1 < %(max_interruptions)s THEN NULL
                                                                                                       ELSE handler_unknown_since
                                                                                                   END,
                                                                                                   error = CASE
                                                                                                               WHEN NOT cancel_requested
                                                                                                                    AND interruption_count + 1 >= %(max_interruptions)s THEN %(spent)s
                                                                                                               ELSE %(summary)s
                                                                                                           END,
                                                                                                           result_ref = NULL,
                                                                                                           limit_keys = NULL,
                                                                                                           current_token = NULL,
                                                                                                           leased_by = '',
                                                                                                           lease_expires_at = NULL,
                                                                                                           updated_at = %(now)s
WHERE current_token = %(token)s
  AND status = 'running'
  AND lease_expires_at < %(lease_expired_before)s RETURNING id,
                                                            status,
                                                            scope_hash,
                                                            job_id,
                                                            handler,
                                                            queue,
                                                            interruption_count,
                                                            batch_id,
                                                            sequence_key,

  (SELECT was.limit_keys
   FROM jobs_job AS was
   WHERE was.id = jobs_job.id) AS limit_keys
