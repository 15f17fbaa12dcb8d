SELECT 'running' AS kind,
       handler,
       queue,
       scope_hash,
       limit_key,
       NULL AS key,
       count(*) AS n
FROM jobs_job
WHERE current_token IS NOT NULL
  AND status = 'running'
  AND (handler IN (%(lim_handler_0)s)
       OR queue IN (%(lim_queue_0)s))
GROUP BY handler,
         queue,
         scope_hash,
         limit_key
UNION ALL
SELECT 'started',
       NULL,
       NULL,
       NULL,
       NULL,
       key,
       count(*)
FROM jobs_claimstart
WHERE (key = %(key_0)s
       AND started_at > %(since_0)s)
  OR (key = %(key_1)s
      AND started_at > %(since_1)s)
GROUP BY key
