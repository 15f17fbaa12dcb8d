UPDATE jobs_job
SET payload_json = %(payload_json)s,
    next_run_at = CASE
                      WHEN debounce_until IS NOT NULL
                           AND debounce_until < %(run_at)s THEN debounce_until
                      ELSE %(run_at)s
                  END,
                  fair_at = CASE
                                WHEN debounce_until IS NOT NULL
                                     AND debounce_until < %(run_at)s THEN (extract(epoch
                                                                                   FROM debounce_until) * 1000000)::bigint
                                ELSE %(run_place)s
                            END,
                            updated_at = %(now)s
WHERE scope_hash = %(scope_hash)s
  AND unique_key = %(unique_key)s
  AND unique_while = 'queued'
  AND status = 'queued'
  AND NOT cancel_requested RETURNING job_id
