SELECT key,
       tat,
       stamps
FROM jobs_ratebucket
WHERE key IN (%(key_0)s)
