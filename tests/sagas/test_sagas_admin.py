"""The sagas admin: read-only pages with steps, data, lease and error; the resume and
compensate actions drive instances through the runner, only for users allowed to."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from sagas import SagaExecutionError, SagaStatus, run_saga, start_saga, store
from sagas.models import SagaInstance
from tests.support.sagas import ORDER, instance, order, runs, stopped_after_reserve

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:sagas_sagainstance_changelist"


def change_url(instance_id) -> str:
    return reverse("admin:sagas_sagainstance_change", args=[instance(instance_id).pk])


def run_action(client: Client, action: str, *instance_ids) -> list[str]:
    response = client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [instance(i).pk for i in instance_ids]},
        follow=True,  # the list page shows (and so consumes) the action's messages
    )
    assert response.redirect_chain == [(reverse(CHANGELIST), 302)]
    texts = [str(m) for m in response.context["messages"]]
    # The admin shows each message with its first letter capitalised: it must
    # still read as written (an instance id stays lowercase).
    content = response.content.decode()
    for text in texts:
        assert f">{escape(text)}</li>" in content
    return texts


@pytest.fixture
def staff_client(django_user_model: Any) -> Any:
    def make(*codenames: str) -> Client:
        user = django_user_model.objects.create_user(
            f"staff-{'-'.join(codenames)}", password="unused", is_staff=True
        )
        perms = Permission.objects.filter(content_type__app_label="sagas", codename__in=codenames)
        assert perms.count() == len(codenames)
        user.user_permissions.add(*perms)
        client = Client()
        client.force_login(user)
        return client

    return make


def test_list_shows_instances_with_status_progress_and_lease(admin_client: Client):
    done = run_saga("fulfilment.order", data=ORDER, idempotency_key="order-7")
    with pytest.raises(SagaExecutionError):
        run_saga("fulfilment.order-with-notice", data=order(fail_at="charge"))
    live = store.claim(start_saga("fulfilment.order", data=ORDER), "node-3", lease_seconds=60)

    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    content = response.content.decode()
    for expected in (str(done.instance_id), "3/3", "2/3, 2 undone", "node-3", "Compensated"):
        assert expected in content
    assert "Resume selected instances" in content
    assert "Compensate selected instances" in content
    listed = admin_client.get(reverse(CHANGELIST), {"status__exact": "running"})
    assert [i.instance_id for i in listed.context["cl"].result_list] == [live.instance_id]
    by_key = admin_client.get(reverse(CHANGELIST), {"q": "order-7"})
    assert [i.instance_id for i in by_key.context["cl"].result_list] == [done.instance_id]


def test_instance_page_shows_steps_data_error_and_nothing_is_editable(admin_client: Client):
    with pytest.raises(SagaExecutionError) as caught:
        run_saga("fulfilment.order-with-notice", data=order(fail_at="charge", note="<b>x</b>"))

    response = admin_client.get(change_url(caught.value.instance_id))
    assert response.status_code == 200
    content = response.content.decode()
    row = instance(caught.value.instance_id)
    pretty = json.dumps(row.data, indent=2, ensure_ascii=False, sort_keys=True)
    assert f'<pre class="sagas-data">{escape(pretty)}</pre>' in content
    assert "<b>x</b>" not in content
    assert "<td>reserve</td><td>compensated</td><td>yes</td>" in content
    assert "<td>notify</td><td>completed, no compensation (effects remain)</td><td>none</td>" in (
        content
    )
    assert "<td>charge</td><td>failed</td><td>yes</td>" in content
    assert "PaymentDeclined: injected failure in charge" in content
    assert 'name="_save"' not in content
    assert admin_client.post(reverse("admin:sagas_sagainstance_add")).status_code == 403
    delete = reverse("admin:sagas_sagainstance_delete", args=[row.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert SagaInstance.objects.filter(pk=row.pk).exists()


def test_resume_drives_a_stopped_instance_to_its_end(admin_client: Client):
    instance_id = stopped_after_reserve()
    messages = run_action(admin_client, "resume_instances", instance_id)
    assert messages == [f"Instance {instance_id}: succeeded."]
    assert runs(instance_id) == ["reserve", "charge", "ship"]


def test_compensate_undoes_a_running_instance_and_retries_a_failed_one(
    admin_client: Client, settings
):
    running = stopped_after_reserve()
    [message] = run_action(admin_client, "compensate_instances", running)
    assert message == f"Instance {running}: compensated."
    row = instance(running)
    assert row.compensated_steps == ["reserve"]
    assert row.error == "compensation requested in the admin by admin"

    settings.SAGAS = {**settings.SAGAS, "COMPENSATION_ATTEMPTS": 1, "COMPENSATION_RETRY_DELAY": 0}
    with pytest.raises(SagaExecutionError) as caught:
        run_saga("fulfilment.order", data=order(fail_at="ship", fail_compensation={"reserve": 1}))
    failed = caught.value.instance_id
    assert instance(failed).status == SagaStatus.FAILED
    settings.SAGAS = {**settings.SAGAS, "COMPENSATION_ATTEMPTS": 2}
    [message] = run_action(admin_client, "compensate_instances", failed)
    assert message == f"Instance {failed}: compensated (step 'ship' failed)."
    assert instance(failed).status == SagaStatus.COMPENSATED


def test_actions_refuse_finished_and_live_instances_and_say_why(admin_client: Client):
    done = run_saga("fulfilment.order", data=ORDER).instance_id
    live = store.claim(start_saga("fulfilment.order", data=ORDER), "node-1", lease_seconds=300)
    assert live is not None
    messages = run_action(admin_client, "resume_instances", done, live.instance_id)
    assert len(messages) == 2
    assert any("is succeeded; only running or compensating" in m for m in messages)
    assert any("leased by 'node-1'" in m for m in messages)
    assert instance(live.instance_id).version == live.version


def test_an_expired_lease_can_be_resumed_from_the_admin(admin_client: Client):
    claimed = store.claim(start_saga("fulfilment.order", data=ORDER), "dead", lease_seconds=1)
    SagaInstance.objects.filter(instance_id=claimed.instance_id).update(
        leased_until=timezone.now() - timedelta(seconds=5)
    )
    [message] = run_action(admin_client, "resume_instances", claimed.instance_id)
    assert message.endswith("succeeded.")


def test_view_only_staff_see_pages_but_no_actions(staff_client):
    instance_id = stopped_after_reserve()
    viewer = staff_client("view_sagainstance")
    response = viewer.get(reverse(CHANGELIST))
    assert response.status_code == 200
    content = response.content.decode()
    assert "Resume selected" not in content
    assert "Compensate selected" not in content
    assert viewer.get(change_url(instance_id)).status_code == 200
    # Posting the action anyway does nothing.
    viewer.post(
        reverse(CHANGELIST),
        {"action": "resume_instances", "_selected_action": [instance(instance_id).pk]},
    )
    assert instance(instance_id).completed_steps == ["reserve"]

    steerer = staff_client("view_sagainstance", "change_sagainstance")
    assert "Resume selected" in steerer.get(reverse(CHANGELIST)).content.decode()
    run_action(steerer, "resume_instances", instance_id)
    assert instance(instance_id).status == SagaStatus.SUCCEEDED
