WITH gone AS
  (DELETE
   FROM jobs_job
   WHERE id = ANY(ARRAY
                    (SELECT id
                     FROM jobs_job
                     WHERE status IN ('failed', 'cancelled', 'interrupted', 'succeeded', 'expired')
                       AND finished_at < %(older_than)s
                     ORDER BY finished_at
                     LIMIT %(limit)s
                     FOR UPDATE SKIP LOCKED))
     AND status IN ('failed',
                    'cancelled',
                    'interrupted',
                    'succeeded',
                    'expired') RETURNING id),
     attempts AS
  (DELETE
   FROM jobs_jobattempt
   WHERE job_id = ANY(ARRAY
                        (SELECT id
                         FROM gone)))
SELECT count(*) AS deleted
FROM gone
