UPDATE jobs_job
SET payload_json = %(payload_json)s,
    next_run_at = CASE
                      WHEN debounce_until IS NOT NULL
                           AND debounce_until < %(run_at)s THEN debounce_until
                      ELSE %(run_at)s
                  END,
                  fair_at = CASE
                                WHEN debounce_until IS NOT NULL
                                     AND debounce_until < %(run_at)s THEN (CAST(strftime('%%s', debounce_until) AS INTEGER) * 1000000 + CAST(substr(strftime('%%f', debounce_until), 4) AS INTEGER) * 1000 + CASE
                                                                                                                                                                                                                 WHEN length(debounce_until) >= 26 THEN CAST(substr(debounce_until, 24, 3) AS INTEGER)
                                                                                                                                                                                                                 ELSE 0
                                                                                                                                                                                                             END)
                                ELSE %(run_place)s
                            END,
                            updated_at = %(now)s
WHERE scope_hash = %(scope_hash)s
  AND unique_key = %(unique_key)s
  AND unique_while = 'queued'
  AND status = 'queued'
  AND NOT cancel_requested RETURNING job_id
