WITH done(token, outcome, result_ref, error, summary) AS (
                                                          VALUES (%(token_0)s,
                                                                  %(outcome_0)s,
                                                                  %(result_ref_0)s,
                                                                  %(error_0)s,
                                                                  %(summary_0)s))
UPDATE jobs_jobattempt AS a
SET status = CASE
                 WHEN j.cancel_requested
                      AND done.outcome <> 'interrupted' THEN 'cancelled'
                 ELSE done.outcome
             END,
             result_ref = CASE
                              WHEN j.cancel_requested THEN NULL
                              ELSE done.result_ref
                          END,
                          error = done.error,
                          finished_at = %(now)s
FROM done,
     jobs_job AS j
WHERE a.job_id = j.id
  AND a.token = done.token
  AND a.status = 'running'
  AND j.current_token = done.token
  AND j.status = 'running'
  AND j.lease_expires_at < %(lease_expired_before)s RETURNING job_id AS job_pk,
                                                              token
