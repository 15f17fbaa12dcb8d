UPDATE jobs_job
SET status = 'running',
    attempt_count = attempt_count + 1,
    current_token = lower(hex(randomblob(16))),
    leased_by = %(worker_id)s,
    lease_expires_at = %(lease_expires_at)s,
    started_at = %(now)s,
    updated_at = %(now)s,
    progress = NULL,
    progress_message = '',
    error = '',
    result_ref = NULL,
    finished_at = NULL
WHERE id IN
    (SELECT id
     FROM jobs_job
     WHERE status = 'queued'
       AND NOT cancel_requested
       AND NOT sequence_held
       AND next_run_at <= %(now)s
       AND attempt_count < max_attempts
       AND (start_by IS NULL
            OR start_by > %(now)s)
       AND queue NOT IN
         (SELECT name
          FROM jobs_queue
          WHERE paused)
     ORDER BY priority DESC,
              fair_at,
              id
     LIMIT %(limit)s) RETURNING id,
                                scope_hash,
                                job_id,
                                current_token AS token,
                                attempt_count AS attempt,
                                max_attempts,
                                handler,
                                handler_version,
                                payload_json,
                                queue,
                                trace_context,
                                sequence_key,
                                attempt_count + snooze_count + release_count + interruption_count AS number,
                                priority,
                                next_run_at,
                                fair_at,
                                leased_by,
                                started_at
