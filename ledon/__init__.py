"""Internal pieces shared by the jobs, outbox and sagas apps.

Not a Django app and not a public API: nothing here imports a model or any of the
three apps, so each of them may import it whether or not the others are installed.
"""
