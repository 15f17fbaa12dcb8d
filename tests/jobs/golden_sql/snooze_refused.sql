SELECT cancel_requested,
       snooze_count,
       handler
FROM jobs_job
WHERE current_token = %(token)s
  AND status = 'running'
