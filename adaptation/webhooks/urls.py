"""Webhook receivers and the deliveries page, under /webhooks/ (namespace "webhooks")."""

from django.urls import path

from adaptation.webhooks import views

app_name = "webhooks"

urlpatterns = [
    path("huggingface/<uuid:endpoint_id>", views.huggingface, name="huggingface"),
    path("generic/<uuid:endpoint_id>", views.generic, name="generic"),
    # Anything else under a receiver's path is the receivers' JSON 404, not an HTML page.
    path("huggingface/<path:rest>", views.not_an_endpoint),
    path("generic/<path:rest>", views.not_an_endpoint),
    path("deliveries/", views.delivery_list, name="deliveries"),
]
