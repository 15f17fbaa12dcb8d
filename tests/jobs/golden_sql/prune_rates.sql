DELETE
FROM jobs_ratebucket
WHERE ends < %(before)s
