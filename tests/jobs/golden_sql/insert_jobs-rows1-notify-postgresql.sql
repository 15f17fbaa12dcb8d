WITH inserted AS
  (INSERT INTO jobs_job (scope_hash, job_id, handler, handler_version, payload_json, queue, priority, max_attempts, initial_not_before, trace_context, next_run_at, status, attempt_count, cancel_requested, progress_message, error, leased_by, created_at, updated_at)
   VALUES (%(scope_hash_0)s,
           %(job_id_0)s,
           %(handler_0)s,
           %(handler_version_0)s,
           %(payload_json_0)s,
           %(queue_0)s,
           %(priority_0)s,
           %(max_attempts_0)s,
           %(initial_not_before_0)s,
           %(trace_context_0)s,
           %(next_run_at_0)s,
           %(status_0)s,
           %(attempt_count_0)s,
           %(cancel_requested_0)s,
           %(progress_message_0)s,
           %(error_0)s,
           %(leased_by_0)s,
           %(created_at_0)s,
           %(updated_at_0)s) ON CONFLICT (scope_hash,
                                          job_id) DO NOTHING RETURNING scope_hash,
                                                                       job_id,
                                                                       queue)
SELECT scope_hash,
       job_id,
       queue,
       pg_notify(%(channel)s, queue) AS notified
FROM inserted
