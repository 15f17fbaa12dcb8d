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
    urlpatterns.append(path("metrics", metrics_view))
