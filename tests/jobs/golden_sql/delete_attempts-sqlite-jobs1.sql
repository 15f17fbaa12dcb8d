DELETE
FROM jobs_jobattempt
WHERE job_id IN (%(job_0)s)
