DELETE
FROM jobs_job
WHERE id IN
    (SELECT id
     FROM jobs_job
     WHERE status IN ('failed',
                      'cancelled',
                      'interrupted',
                      'succeeded',
                      'expired')
       AND finished_at < %(older_than)s
     ORDER BY finished_at
     LIMIT %(limit)s)
  AND status IN ('failed',
                 'cancelled',
                 'interrupted',
                 'succeeded',
                 'expired') RETURNING id
