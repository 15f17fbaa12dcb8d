"""The admin's dashboard in a test client: staff only, the numbers of a known
workload, and nothing loaded from elsewhere; the workers' admin list."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User

from tests.support.dashboard import make_workload
from tests.support.schedules import schedules  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db

URL = "/admin/jobs/dashboard/"


def test_the_dashboard_shows_the_numbers_of_a_known_workload(admin_client, settings):
    make_workload(settings)
    page = admin_client.get(URL)
    assert page.status_code == 200
    html = page.content.decode()
    row = re.search(r'<tr data-queue="dash-a">(.*?)</tr>', html, re.S).group(1)
    assert '<td class="num queued">2</td>' in row
    assert '<td class="num running">1</td>' in row
    assert "5 min" in row  # the oldest due job has waited five minutes
    assert '<td class="num queued">1</td>' in re.search(
        r'<tr data-queue="dash-b">(.*?)</tr>', html, re.S
    ).group(1)
    caption = re.search(
        r'<figure data-queue="dash-a">\s*<figcaption>(.*?)</figcaption>', html, re.S
    )
    assert re.sub(r"<[^>]+>", "", caption.group(1)).startswith("dash-a: 3 succeeded, 1 failed")
    assert 'class="bar-ok"' in html
    assert 'class="bar-failed"' in html
    assert "waiting-long" in re.search(r'<p id="oldest-job">(.*?)</p>', html, re.S).group(1)
    assert "Workers: 1 live, 1 silent" in html
    assert re.search(r'<tr class="silent"><td>dispatcher</td><td>dash-silent</td>', html)
    outbox = re.search(r'data-panel="Outbox">(.*?)</section>', html, re.S).group(1)
    assert '<div class="fact" data-fact="pending"><strong>2</strong>' in outbox
    assert '<div class="fact" data-fact="parked"><strong>1</strong>' in outbox
    sagas = re.search(r'data-panel="Sagas needing attention">(.*?)</section>', html, re.S).group(1)
    assert '<div class="fact" data-fact="needing attention"><strong>1</strong>' in sagas
    assert "dash-order" in sagas
    assert '<meta http-equiv="refresh" content="10">' in html


def test_nothing_on_the_page_comes_from_another_site(admin_client, settings):
    make_workload(settings)
    html = admin_client.get(URL).content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources
    # Every address is a path on this site (the admin's own static files included).
    assert [s for s in sources if re.match(r"(https?:)?//", s)] == []


def test_only_staff_who_may_view_jobs_see_it(client):
    assert client.get(URL).status_code == 302  # to the login page
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(URL).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    staff = User.objects.get(pk=staff.pk)
    client.force_login(staff)
    assert client.get(URL).status_code == 200
    assert client.get(URL + "?refresh=0").content.count(b'http-equiv="refresh"') == 0


def test_the_workers_list_says_live_or_silent(admin_client, settings):
    make_workload(settings)
    html = admin_client.get("/admin/jobs/workerrecord/").content.decode()
    assert "dash-live" in html
    assert re.search(r"dash-silent.*?silent for 10 min", html, re.S)
    assert ">live<" in html


@pytest.mark.usefixtures("schedules")
def test_the_dashboard_lists_the_schedules_next_runs(admin_client):
    from datetime import timedelta

    from django.utils import timezone

    from jobs import execution, periodic
    from jobs.schedules.models import Schedule

    periodic(timedelta(hours=1), name="dash-hourly", handler="demo.report")
    execution.enqueue_due_schedules(now=timezone.now())
    stored = Schedule.objects.get(name="dash-hourly")
    html = admin_client.get(URL).content.decode()
    section = re.search(r'<section id="schedules">(.*?)</section>', html, re.S).group(1)
    expected = timezone.localtime(stored.next_run_at).strftime("%Y-%m-%d %H:%M:%S")
    assert f"<td>dash-hourly</td><td>{expected}</td><td>demo.report</td>" in section


#: Each panel of the dashboard beside its own model's admin page: a user sees the
#: panel exactly when that page lets them in.
PANELS = {
    "view_workerrecord": ('<section id="workers"', "/admin/jobs/workerrecord/"),
    "view_schedule": ('<section id="schedules"', "/admin/jobs/schedule/"),
    "view_outboxmessage": ('data-panel="Outbox"', "/admin/outbox/outboxmessage/"),
    "view_sagainstance": (
        'data-panel="Sagas needing attention"',
        "/admin/sagas/sagainstance/",
    ),
}


def staff_with(client, *codenames: str) -> User:
    user, _ = User.objects.get_or_create(username="panel-staff", defaults={"is_staff": True})
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    user = User.objects.get(pk=user.pk)
    client.force_login(user)
    return user


def test_staff_who_may_only_view_jobs_see_no_other_panel(client, settings):
    make_workload(settings)
    staff_with(client, "view_job")
    page = client.get(URL)
    assert page.status_code == 200
    html = page.content.decode()
    assert '<tr data-queue="dash-a">' in html  # the jobs' own numbers
    for marker, admin_page in PANELS.values():
        assert marker not in html, marker
        assert client.get(admin_page).status_code == 403, admin_page
    # Nothing of the workers' rows leaks elsewhere on the page either.
    assert "dash-live" not in html
    assert "dash-silent" not in html
    assert "dash-order" not in html
    # The hidden panels' queries do not run at all.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert client.get(URL).status_code == 200
    read = " ".join(query["sql"] for query in queries.captured_queries)
    for table in ("jobs_workerrecord", "jobs_schedule", "outbox_outboxmessage", "sagas_"):
        assert table not in read, table


@pytest.mark.parametrize("codename", sorted(PANELS))
def test_each_panel_shows_with_its_models_view_permission(client, settings, codename):
    make_workload(settings)
    staff_with(client, "view_job", codename)
    html = client.get(URL).content.decode()
    marker, admin_page = PANELS[codename]
    assert marker in html
    assert client.get(admin_page).status_code == 200
    for other, (other_marker, _page) in PANELS.items():
        if other != codename:
            assert other_marker not in html, other_marker


def test_the_breadcrumbs_are_drawn_as_the_admins_own_pages_draw_them(admin_client):
    """Django 6.1 styles ``ol.breadcrumbs`` only: a ``div`` drawn as before 6.1 was
    left unstyled. The dashboard's are the same element as a page of the admin's own."""
    crumbs = re.compile(r'<(ol|div) class="breadcrumbs">(.*?)</\1>', re.S)
    own = crumbs.search(admin_client.get("/admin/jobs/job/").content.decode())
    ours = crumbs.search(admin_client.get(URL).content.decode())
    assert own is not None
    assert ours is not None
    assert ours.group(1) == own.group(1)
    assert re.findall(r'<a href="([^"]+)">([^<]+)</a>', ours.group(2)) == [
        ("/admin/", "Home"),
        ("/admin/jobs/", "Jobs"),
    ]
    assert (
        ours.group(2)
        .rstrip()
        .endswith(
            '<li aria-current="page">Dashboard</li>' if ours.group(1) == "ol" else "Dashboard"
        )
    )


def test_before_django_6_1_the_breadcrumbs_are_a_div(monkeypatch):
    from ledon import dashboard

    monkeypatch.setattr(dashboard, "BREADCRUMBS_AS_LIST", False)
    assert dashboard.breadcrumbs(("Home", "/admin/"), ("J<b>", "/j/"), ("Here", "")) == (
        '<div class="breadcrumbs"><a href="/admin/">Home</a> &rsaquo; '
        '<a href="/j/">J&lt;b&gt;</a> &rsaquo; Here</div>'
    )
