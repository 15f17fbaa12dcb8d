from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    path("shop/", include("testproject.shop.urls")),
]

try:  # the Prometheus metrics, with the [metrics] extra installed
    from ledon.metrics import metrics_view
except ImportError:  # pragma: no cover - a project without the extra
    pass
else:
    # Protected by the view itself: staff who may view, or LEDON_METRICS_TOKEN.
    urlpatterns.append(path("metrics", metrics_view))
