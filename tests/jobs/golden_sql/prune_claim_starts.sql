DELETE
FROM jobs_claimstart
WHERE started_at < %(before)s
