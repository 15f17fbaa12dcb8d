from django.urls import path

from . import views

app_name = "shop"
urlpatterns = [
    path("", views.catalogue, name="catalogue"),
    path("orders/<str:number>/", views.order_page, name="order"),
    path("orders/<str:number>/invoice.json", views.invoice_progress, name="invoice-progress"),
    path("baskets/", views.baskets, name="baskets"),
    path("baskets/<str:number>/", views.basket_page, name="basket"),
    path("baskets/<str:number>/pay/", views.pay, name="basket-pay"),
]
