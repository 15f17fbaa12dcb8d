from django.apps import AppConfig


class WorkflowBenchConfig(AppConfig):
    name = "benchmarks.wfapp"
    label = "wfbench"
