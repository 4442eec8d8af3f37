"""Webhook receivers and the deliveries page, under /webhooks/ (namespace "webhooks")."""

from django.urls import path

from adaptation.webhooks import views

app_name = "webhooks"

urlpatterns = [
    path("huggingface/<uuid:endpoint_id>", views.huggingface, name="huggingface"),
    path("generic/<uuid:endpoint_id>", views.generic, name="generic"),
    path("deliveries/", views.delivery_list, name="deliveries"),
]
