UPDATE outbox_outboxmessage
SET status = %s,
    sent_at = %s,
    updated_at = %s,
    last_error = '',
    leased_by = '',
    lease_token = NULL,
    lease_expires_at = NULL
WHERE lease_token = %s
  AND status = %s
  AND message_id IN (%s,
                     %s,
                     %s) RETURNING message_id,
                                   key,
                                   followed
