INSERT INTO jobs_jobattempt (job_id, number, token, status, worker_id, progress, progress_message, error, result_ref, started_at, finished_at)
VALUES (%(job_id_0)s, %(number_0)s, %(token_0)s, 'running', %(worker_id)s, NULL, '', '', NULL, %(now)s, NULL),
       (%(job_id_1)s, %(number_1)s, %(token_1)s, 'running', %(worker_id)s, NULL, '', '', NULL, %(now)s, NULL),
       (%(job_id_2)s, %(number_2)s, %(token_2)s, 'running', %(worker_id)s, NULL, '', '', NULL, %(now)s, NULL)
