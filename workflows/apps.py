from __future__ import annotations

# The module, not the class: Django takes the one AppConfig subclass named in apps.py.
import ledon.apps

from .conf import workflows_settings


class WorkflowsConfig(ledon.apps.LedonAppConfig):
    name = "workflows"
    verbose_name = "Workflows"
    read_settings = workflows_settings
    metrics_permission = "workflows.view_workflowrun"

    def wire_up(self) -> None:
        # The jobs' workers run the workflows' handlers: a worker refuses to start,
        # naming migrate, while the workflows' tables are missing.
        from ledon.engine import runs_inside

        runs_inside("jobs", self.label)
        # The jobs that advance runs and run activity items are handled in every
        # process, whatever JOBS["AUTODISCOVER_MODULE"] names: the advance's handler
        # is registered as its module is imported (it imports the models, loaded by
        # now), each activity's as the registry records it, before ready or after.
        from . import registry
        from .handlers import register_activity_handler

        registry.watch_activities(register_activity_handler)
        # An item job that fails for good outside its activity's code ends its item.
        from jobs.signals import attempt_finished

        from .receivers import on_attempt_finished

        attempt_finished.connect(on_attempt_finished, dispatch_uid="workflows.item_job_ended")
        # So does one cancelled while Queued (no attempt ends for it).
        from jobs.signals import queued_job_cancelled

        from .receivers import on_queued_job_cancelled

        queued_job_cancelled.connect(
            on_queued_job_cancelled, dispatch_uid="workflows.item_job_cancelled"
        )
        # And one that keeps killing its worker, recovered by any process.
        from jobs.signals import job_keeps_killing_worker

        from .receivers import on_job_keeps_killing_worker

        job_keeps_killing_worker.connect(
            on_job_keeps_killing_worker, dispatch_uid="workflows.job_keeps_killing_worker"
        )
        # Beside every worker, the upkeep deletes finished runs past their retention
        # on a time basis, and ends the items whose job ended without recording them.
        from jobs.signals import worker_started, worker_stopping

        from .upkeep import on_worker_started, on_worker_stopping

        worker_started.connect(on_worker_started, dispatch_uid="workflows.upkeep")
        worker_stopping.connect(on_worker_stopping, dispatch_uid="workflows.upkeep")
