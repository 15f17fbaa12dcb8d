SELECT id,
       handler,
       queue,
       scope_hash,
       limit_key,
       cost
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
  AND queue IN (%(queue_0)s,
                %(queue_1)s)
  AND scope_hash = %(scope_hash)s
  AND job_id = %(job_id)s
  AND handler NOT IN (%(fh_0)s)
  AND queue NOT IN (%(fq_0)s)
  AND NOT ((handler = %(fhs_k_0)s
            AND scope_hash = %(fhs_s_0)s))
  AND NOT ((queue = %(fqs_k_0)s
            AND scope_hash = %(fqs_s_0)s))
  AND NOT ((handler = %(fhk_k_0)s
            AND limit_key = %(fhk_s_0)s))
  AND NOT ((queue = %(fqk_k_0)s
            AND limit_key = %(fqk_s_0)s))
  AND id NOT IN (%(seen_0)s,
                 %(seen_1)s)
ORDER BY priority DESC,
         fair_at,
         id
LIMIT %(limit)s
