"""Watching workflow runs: hooks observers connect to, the optional metrics, and the
reads behind the admin dashboard's panel."""
