"""The URLs of the jobs-only test project (``settings_jobs_only``): the admin alone."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
