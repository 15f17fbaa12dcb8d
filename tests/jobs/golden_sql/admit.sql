INSERT INTO jobs_sequence AS s (scope_hash, sequence_key, open, updated_at)
VALUES (%(scope_hash)s, %(sequence_key)s, %(count)s, %(now)s) ON CONFLICT (scope_hash, sequence_key) DO
UPDATE
SET open = s.open + excluded.open,
           updated_at = excluded.updated_at RETURNING open,
                                                      halted_by
