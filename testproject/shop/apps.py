from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "testproject.shop"
    label = "shop"
    verbose_name = "Shop (demo)"
