WITH done AS
  (SELECT *
   FROM unnest(%(tokens)s::text[], %(outcomes)s::text[], %(results)s::text[], %(errors)s::text[], %(summaries)s::text[]) AS d(token, outcome, result_ref, error, summary)),
     orphans AS
  (SELECT done.token
   FROM done
   JOIN jobs_job AS j ON j.current_token = done.token
   WHERE j.current_token = ANY(%(tokens)s::text[])
     AND j.current_token = done.token
     AND j.status = 'running'
     AND j.leased_by = %(leased_by)s
     AND NOT EXISTS
       (SELECT 1
        FROM jobs_jobattempt AS a
        WHERE a.job_id = j.id
          AND a.token = done.token
          AND a.status = 'running')),
     finished AS
  (UPDATE jobs_job AS j
   SET status = CASE
                    WHEN j.cancel_requested THEN 'cancelled'
                    ELSE done.outcome
                END,
                result_ref = CASE
                                 WHEN j.cancel_requested THEN NULL
                                 ELSE done.result_ref
                             END,
                             error = done.summary,
                             finished_at = %(now)s,
                             updated_at = %(now)s,
                             current_token = NULL,
                             leased_by = '',
                             lease_expires_at = NULL
   FROM done,
        jobs_jobattempt AS a
   WHERE j.current_token = ANY(%(tokens)s::text[])
     AND j.current_token = done.token
     AND j.status = 'running'
     AND j.leased_by = %(leased_by)s
     AND a.job_id = j.id
     AND a.token = done.token
     AND a.status = 'running'
     AND NOT EXISTS
       (SELECT 1
        FROM orphans) RETURNING j.id,
                                j.status,
                                j.queue,
                                j.cancel_requested,
                                done.token,
                                done.outcome,
                                done.result_ref,
                                done.error),
     finished_attempts AS
  (UPDATE jobs_jobattempt AS a
   SET status = CASE
                    WHEN finished.cancel_requested
                         AND finished.outcome <> 'interrupted' THEN 'cancelled'
                    ELSE finished.outcome
                END,
                result_ref = CASE
                                 WHEN finished.cancel_requested THEN NULL
                                 ELSE finished.result_ref
                             END,
                             error = finished.error,
                             finished_at = %(now)s
   FROM finished
   WHERE a.job_id = finished.id
     AND a.token = finished.token
     AND a.status = 'running' RETURNING a.token)
SELECT 'finished' AS kind,
       token,
       id,
       status,
       queue,
       token IN
  (SELECT token
   FROM finished_attempts) AS attempt_finished
FROM finished
UNION ALL
SELECT 'orphan',
       token,
       NULL,
       NULL,
       NULL,
       NULL
FROM orphans
