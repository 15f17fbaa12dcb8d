INSERT INTO jobs_ratebucket (key, tat, horizon, stamps, used, cap, window_start, ends)
VALUES (%(key_0)s, %(tat_0)s, %(horizon_0)s, %(stamps_0)s, %(used_0)s, %(cap_0)s, %(window_start_0)s, %(ends_0)s) ON CONFLICT (key) DO
UPDATE
SET tat = excluded.tat,
    horizon = excluded.horizon,
    stamps = excluded.stamps,
    used = excluded.used,
    cap = excluded.cap,
    window_start = excluded.window_start,
    ends = excluded.ends
