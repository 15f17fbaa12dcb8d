from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

from ledon.metrics import metrics_view

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    path("shop/", include("testproject.shop.urls")),
]

# The Prometheus metrics, protected by the view itself: staff who may view, or
# LEDON_METRICS_TOKEN. Without the [metrics] extra the view says how to install it.
urlpatterns.append(path("metrics", metrics_view))
