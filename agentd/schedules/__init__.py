"""Cron jobs, manifest schedules and the ticker that fires them (see scheduler.py)."""
