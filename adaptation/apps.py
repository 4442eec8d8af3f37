from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AdaptationConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "adaptation"
    verbose_name = "Day-0 adaptation"

    def ready(self) -> None:
        """Keep the role groups (`adaptation.roles`) in sync after every `migrate`, once
        Django has created this app's permissions (its receiver is connected earlier); refuse
        to start (`ImproperlyConfigured`) when `DAY0_READINESS` names an unregistered stage;
        let every hub source send its kind's token (`HF_TOKEN`, `MODELSCOPE_API_TOKEN`) to the
        allow-listed hubs of its kind too (`adaptation.models.hub_endpoints`)."""
        from django.conf import settings

        from adaptation.models.hub_endpoints import hub_token_allowed
        from adaptation.readiness import readiness_thresholds_check
        from adaptation.roles import sync_roles_after_migrate
        from engine.hubs.trust import token_check_set

        post_migrate.connect(
            sync_roles_after_migrate, sender=self, dispatch_uid="adaptation.roles.sync"
        )
        readiness_thresholds_check(settings.DAY0_READINESS)
        token_check_set(hub_token_allowed)
