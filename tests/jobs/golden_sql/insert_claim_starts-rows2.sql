INSERT INTO jobs_claimstart (key, started_at)
VALUES (%(key_0)s, %(now)s),
       (%(key_1)s, %(now)s)
