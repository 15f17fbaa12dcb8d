WITH done(token, outcome, result_ref, error, summary) AS (
                                                          VALUES (%(token_0)s,
                                                                  %(outcome_0)s,
                                                                  %(result_ref_0)s,
                                                                  %(error_0)s,
                                                                  %(summary_0)s))
UPDATE jobs_job AS j
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
FROM done
WHERE j.current_token = done.token
  AND j.status = 'running' RETURNING id,
                                     status,
                                     queue,
                                     scope_hash,
                                     job_id,
                                     handler,
                                     batch_id,
                                     sequence_key
