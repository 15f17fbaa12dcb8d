"""A web view for the tracing tests: it places an order the way a project's view does —
a job staged in the request's transaction — inside the request's server span (which
opentelemetry-instrumentation-django would open in a real project)."""

from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from opentelemetry import trace

from jobs import JobSubmission, stage_job


@csrf_exempt
def place(request: HttpRequest) -> HttpResponse:
    tracer = trace.get_tracer("tests.web")
    with tracer.start_as_current_span("POST /place", kind=trace.SpanKind.SERVER) as span:
        body = json.loads(request.body)
        with transaction.atomic():
            snap = stage_job(
                "web",
                body["order"],
                JobSubmission.create(body["handler"], body, max_attempts=body.get("attempts", 1)),
            )
        return JsonResponse(
            {"job": snap.job_id, "trace_id": format(span.get_span_context().trace_id, "032x")}
        )


urlpatterns = [path("place", place)]
