from django.apps import AppConfig


class AdaptationConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "adaptation"
    verbose_name = "Day-0 adaptation"
