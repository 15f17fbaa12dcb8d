"""The metrics view a project routes, protected, and importable without the
``[metrics]`` extra: a URLconf that routes it always loads, and the view itself says
when prometheus-client is missing. The metrics themselves are :mod:`ledon.prometheus`,
imported when the view first answers.

::

    path("metrics", ledon.metrics.metrics_view)
"""

from __future__ import annotations

import hmac

from django.apps import apps
from django.http import HttpRequest, HttpResponse

from .conf import metrics_token

#: What :func:`metrics_view` answers a permitted request without prometheus-client.
MISSING_EXTRA = (
    "The metrics need prometheus-client, which is not installed: "
    "pip install 'django-ledon[metrics]'\n"
)


def view_permissions() -> list[str]:
    """The permissions :func:`metrics_view` asks of a signed-in user: to view the rows
    whose numbers the metrics show, in every installed app that has metrics (each app
    config's ``metrics_permission``)."""
    return [
        permission
        for config in apps.get_app_configs()
        if (permission := getattr(config, "metrics_permission", ""))
    ]


def may_read_metrics(request: HttpRequest) -> bool:
    """Whether ``request`` may read the metrics: it carries ``Authorization: Bearer
    <LEDON_METRICS_TOKEN>``, or its user is active staff with every permission of
    :func:`view_permissions`."""
    token = metrics_token()
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    if token is not None and scheme.lower() == "bearer" and sent:
        return hmac.compare_digest(sent.strip().encode(), token.encode())
    user = request.user if hasattr(request, "user") else None
    if user is None or not (user.is_active and user.is_staff):
        return False
    return bool(user.has_perms(view_permissions()))


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus' text format, for a project's URLconf::

        path("metrics", ledon.metrics.metrics_view)

    Protected: it answers a request with ``Authorization: Bearer <token>`` where
    ``settings.LEDON_METRICS_TOKEN`` is that token, or a signed-in, active staff user
    who may view the rows of every installed app with metrics (jobs, outbox messages,
    saga instances, workflow runs); anyone else gets 401 (no credentials) or 403. The
    first answered request turns on the metrics of every installed app. Without the
    ``[metrics]`` extra, a permitted request gets 501 and a line naming it."""
    if not may_read_metrics(request):
        signed_in = hasattr(request, "user") and request.user.is_authenticated
        if signed_in or request.headers.get("Authorization"):
            return HttpResponse("Forbidden\n", status=403, content_type="text/plain")
        response = HttpResponse("Unauthorized\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    try:
        from . import prometheus  # the [metrics] extra
    except ImportError:
        return HttpResponse(MISSING_EXTRA, status=501, content_type="text/plain")
    body, content_type = prometheus.exposition()
    return HttpResponse(body, content_type=content_type)
