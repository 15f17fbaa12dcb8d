SELECT handler,
       queue,
       scope_hash,
       limit_key,
       count(*) AS n
FROM jobs_job
WHERE current_token IS NOT NULL
  AND status = 'running'
  AND (handler IN (%(lim_handler_0)s))
GROUP BY handler,
         queue,
         scope_hash,
         limit_key
