"""The outbox admin: read-only pages with filters, search and pretty JSON; the
"Redeliver now", "Park" and "Discard" actions change state only through the store and
only for users allowed to; halted keys are shown with the message and error that halt
them; the inbox is read-only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from outbox import IntegrationEvent, store, unit_of_work
from outbox.inbox import consume
from outbox.models import InboxMessage, OutboxMessage
from outbox.types import DeliveryReport, Envelope, MessageStatus

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:outbox_outboxmessage_changelist"


@dataclass(frozen=True)
class Noticed(IntegrationEvent, name="test.admin.noticed"):
    text: str


@dataclass(frozen=True)
class Other(IntegrationEvent, name="test.admin.other"):
    n: int


@pytest.fixture(autouse=True)
def outbox_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True, "MAX_ATTEMPTS": 1}


def add(event: IntegrationEvent, **kwargs: Any) -> Envelope:
    with unit_of_work() as uow:
        return uow.add_integration_event(event, **kwargs)


def parked(text: str = "poison", **kwargs: Any) -> Envelope:
    """A parked message; call before adding pending ones (the claim takes the oldest)."""
    envelope = add(Noticed(text), **kwargs)
    batch = store.claim_batch("admin-test", limit=1)
    assert batch is not None
    store.record_deliveries(
        batch.token, [DeliveryReport.failed(envelope.message_id, "broker rejected")], retry_at={}
    )
    return envelope


def sent(text: str = "done") -> Envelope:
    envelope = add(Noticed(text))
    batch = store.claim_batch("admin-test", limit=1)
    assert batch is not None
    store.record_deliveries(
        batch.token, [DeliveryReport.delivered(envelope.message_id)], retry_at={}
    )
    return envelope


def row(envelope: Envelope) -> OutboxMessage:
    return OutboxMessage.objects.get(message_id=envelope.message_id)


def listed(client: Client, **params: str) -> set[str]:
    response = client.get(reverse(CHANGELIST), params)
    assert response.status_code == 200
    return {str(m.message_id) for m in response.context["cl"].result_list}


def run_action(client: Client, action: str, *envelopes: Envelope) -> list[str]:
    response = client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [row(e).pk for e in envelopes]},
        follow=True,
    )
    assert response.status_code == 200
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.fixture
def staff_client(django_user_model: Any) -> Any:
    def make(*codenames: str) -> Client:
        user = django_user_model.objects.create_user(
            username=f"staff-{'-'.join(codenames) or 'none'}", password="x", is_staff=True
        )
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="outbox", codename__in=codenames)
        )
        client = Client()
        client.force_login(user)
        return client

    return make


def test_filters_by_status_and_type_and_search_by_message_id_or_key(admin_client: Client):
    poison = parked()  # the helpers claim the oldest due message: settle these first
    done = sent()
    pending = add(Noticed("a"), key="customer-9")
    other = add(Other(1))
    assert listed(admin_client) == {str(e.message_id) for e in (pending, poison, done, other)}
    assert listed(admin_client, status__exact="parked") == {str(poison.message_id)}
    assert listed(admin_client, status__exact="sent") == {str(done.message_id)}
    assert listed(admin_client, event_type__exact="test.admin.other") == {str(other.message_id)}
    assert listed(admin_client, q=str(pending.message_id)) == {str(pending.message_id)}
    assert listed(admin_client, q="customer") == {str(pending.message_id)}
    assert listed(admin_client, q="not-a-uuid") == set()


def test_message_page_pretty_prints_escaped_payload_headers_and_error(admin_client: Client):
    poison = parked()
    content = admin_client.get(
        reverse("admin:outbox_outboxmessage_change", args=[row(poison).pk])
    ).content.decode()
    assert "broker rejected" in content
    envelope = add(Noticed("<script>x</script>"), headers={"trace": "t-1"})
    response = admin_client.get(
        reverse("admin:outbox_outboxmessage_change", args=[row(envelope).pk])
    )
    assert response.status_code == 200
    content = response.content.decode()
    pretty = json.dumps({"text": "<script>x</script>"}, indent=2)
    assert escape(pretty) in content
    assert "<script>x</script>" not in content
    assert escape(json.dumps({"trace": "t-1"}, indent=2)) in content
    assert 'name="_save"' not in content  # nothing editable


def test_nothing_can_be_added_changed_or_deleted_by_hand(admin_client: Client):
    envelope = add(Noticed("a"))
    assert admin_client.get(reverse("admin:outbox_outboxmessage_add")).status_code == 403
    pk = row(envelope).pk
    response = admin_client.post(
        reverse("admin:outbox_outboxmessage_change", args=[pk]), {"status": "sent"}
    )
    assert response.status_code == 403
    assert (
        admin_client.post(reverse("admin:outbox_outboxmessage_delete", args=[pk])).status_code
        == 403
    )
    assert row(envelope).status == MessageStatus.PENDING


def test_redeliver_now_through_the_store_and_refusals_listed(admin_client: Client):
    poison, done = parked(), sent()
    messages = run_action(admin_client, "redeliver_messages", poison, done)
    assert messages[0] == "1 redelivered, 1 refused."
    assert "is sent; it cannot be redelivered" in messages[1]
    message = row(poison)
    assert (message.status, message.attempts) == (MessageStatus.PENDING, 0)
    assert row(done).status == MessageStatus.SENT


def test_park_through_the_store(admin_client: Client):
    pending = add(Noticed("a"))
    messages = run_action(admin_client, "park_messages", pending)
    assert messages == ["1 parked."]
    message = row(pending)
    assert message.status == MessageStatus.PARKED
    assert message.last_error == "parked by admin in the admin"


def test_the_key_order_filter_shows_halted_keys_with_their_error_and_who_waits(
    admin_client: Client,
):
    poison = parked(key="order-7")
    behind = [add(Noticed(f"then {n}"), key="order-7") for n in range(2)]
    other = add(Noticed("elsewhere"), key="order-8")
    keyless = add(Other(1))
    assert listed(admin_client, key_order="halts") == {str(poison.message_id)}
    assert listed(admin_client, key_order="waits") == {str(e.message_id) for e in behind}
    changelist = admin_client.get(reverse(CHANGELIST), {"key_order": "halts"})
    assert b"broker rejected" in changelist.content  # why it halts, in the list
    page = admin_client.get(
        reverse("admin:outbox_outboxmessage_change", args=[row(poison).pk])
    ).content.decode()
    assert "halts its key until redelivered or discarded" in page
    assert "2 message(s) wait behind it" in page
    assert "key__exact=order-7&amp;key_order=waits" in page
    waiting = admin_client.get(
        reverse("admin:outbox_outboxmessage_change", args=[row(behind[0]).pk])
    ).content.decode()
    assert "waits for an earlier message of its key" in waiting
    assert listed(admin_client, key__exact="order-7", key_order="waits") == {
        str(e.message_id) for e in behind
    }
    assert {str(other.message_id), str(keyless.message_id)} <= listed(admin_client)


def test_discard_through_the_store_releases_the_key_and_refusals_listed(admin_client: Client):
    poison = parked(key="order-7")
    behind = add(Noticed("then"), key="order-7")
    pending = add(Other(1))
    messages = run_action(admin_client, "discard_messages", poison, pending)
    assert messages[0] == "1 discarded, 1 refused."
    assert "is pending; it cannot be discarded" in messages[1]
    assert not OutboxMessage.objects.filter(message_id=poison.message_id).exists()
    assert row(behind).held is False
    assert listed(admin_client, key_order="halts") == set()


def test_staff_who_may_only_view_see_no_actions_and_cannot_run_them(staff_client):
    viewer = staff_client("view_outboxmessage")
    poison = parked()
    response = viewer.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert b"redeliver_messages" not in response.content
    viewer.post(
        reverse(CHANGELIST),
        {"action": "redeliver_messages", "_selected_action": [row(poison).pk]},
    )
    assert row(poison).status == MessageStatus.PARKED

    steerer = staff_client("view_outboxmessage", "change_outboxmessage")
    assert b"redeliver_messages" in steerer.get(reverse(CHANGELIST)).content
    run_action(steerer, "redeliver_messages", poison)
    assert row(poison).status == MessageStatus.PENDING


def test_the_inbox_is_read_only(admin_client: Client):
    with unit_of_work(), consume("billing", "m-1"):
        pass
    record = InboxMessage.objects.get()
    changelist = admin_client.get(reverse("admin:outbox_inboxmessage_changelist"))
    assert changelist.status_code == 200
    assert b"m-1" in changelist.content
    page = admin_client.get(reverse("admin:outbox_inboxmessage_change", args=[record.pk]))
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert admin_client.get(reverse("admin:outbox_inboxmessage_add")).status_code == 403
