INSERT INTO jobs_ratebucket (key, tat, horizon, stamps, used, cap, window_start, ends)
VALUES (%(key_0)s, %(tat_0)s, %(horizon_0)s, %(stamps_0)s, %(used_0)s, %(cap_0)s, %(window_start_0)s, %(ends_0)s),
       (%(key_1)s, %(tat_1)s, %(horizon_1)s, %(stamps_1)s, %(used_1)s, %(cap_1)s, %(window_start_1)s, %(ends_1)s),
       (%(key_2)s, %(tat_2)s, %(horizon_2)s, %(stamps_2)s, %(used_2)s, %(cap_2)s, %(window_start_2)s, %(ends_2)s) ON CONFLICT (key) DO
UPDATE
SET tat = excluded.tat,
    horizon = excluded.horizon,
    stamps = excluded.stamps,
    used = excluded.used,
    cap = excluded.cap,
    window_start = excluded.window_start,
    ends = excluded.ends
