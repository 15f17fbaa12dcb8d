from django.contrib import admin

from .models import Notification, Order, Payment, Product, Shipment


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("sku", "name", "price", "stock")


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("number", "email", "product", "quantity", "total", "status", "invoice")
    list_filter = ("status",)
    search_fields = ("number", "email")


admin.site.register(Payment)
admin.site.register(Shipment)
admin.site.register(Notification)
