"""The metrics view, routed as a project routes it (for the metrics tests)."""

from django.urls import path

from ledon.metrics import metrics_view

urlpatterns = [path("metrics", metrics_view)]
